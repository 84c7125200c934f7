"""The Azure settings and URL forms docs/object_storage.md says work, each tried against Azurite
(tests/support/azure_server.py) through the CLI and the real libraries: an account key and a SAS token
with an explicit endpoint (as for a sovereign cloud or a private endpoint; no emulator flag), the
``abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX`` form, and what is refused: a SAS
without write permission, an expired SAS (one line naming the settings, never the token), a URL
with credentials in it, an ``abfss`` host that is not an account's endpoint.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from modelinit.cli import main

from tests.support.azure_server import ACCOUNT, FOREIGN_SETTINGS, KEY
from tests.support.stores import CLI_ARGS as ARGS
from tests.support.stores import cli_expected, cli_spec  # noqa: F401 - the spec and expected fixtures

pytest.importorskip("obstore")
pytest.importorskip("azure.storage.blob")



@pytest.fixture()
def account(azure_server, monkeypatch):
    """The emulator reached as a plain account: no emulator flag, an explicit endpoint over HTTP.
    Yields the server; the test sets the credential."""
    for k in (*FOREIGN_SETTINGS, "AZURE_STORAGE_USE_EMULATOR", "AZURITE_BLOB_STORAGE_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", f"{azure_server.endpoint}/{ACCOUNT}")
    monkeypatch.setenv("AZURE_ALLOW_HTTP", "true")
    monkeypatch.setattr("modelinit.bucket.RETRIES", 0)
    return azure_server


@pytest.mark.slow
def test_an_account_key_from_a_file(account, spec, expected, monkeypatch, tmp_path):
    """The key as a mounted Secret gives it, a file of MODELINIT_STORE_SECRETS (modelinit.store_secrets),
    over a wrong one in the environment."""
    import base64

    container = account.new_container()
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", base64.b64encode(b"not the account's key").decode())
    assert main(["init", spec, *ARGS, "--out", f"az://{container}/m"]) == 1  # the control: the env's key is refused
    store = tmp_path / "store"
    store.mkdir()
    (store / "AZURE_STORAGE_ACCOUNT_KEY").write_text(KEY + "\n")
    monkeypatch.setenv("MODELINIT_STORE_SECRETS", str(store))
    assert main(["init", spec, *ARGS, "--out", f"az://{container}/m"]) == 0
    assert _written(account, container) == expected


def _sas(container: str, expires_in: timedelta, **permissions: bool) -> str:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    return generate_container_sas(ACCOUNT, container, account_key=KEY, permission=ContainerSasPermissions(**permissions),
                                  expiry=datetime.now(timezone.utc) + expires_in)


def _written(server, container: str, prefix: str = "m") -> dict[str, bytes]:
    return server.blobs(container, f"{prefix}/")


def _one_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("modelinit: error: "), lines
    return lines[0]


@pytest.mark.slow
def test_an_account_key(account, spec, expected, monkeypatch):
    container = account.new_container()
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    assert main(["init", spec, *ARGS, "--out", f"az://{container}/m"]) == 0
    assert main(["verify", f"az://{container}/m", "--no-regenerate"]) == 0
    assert _written(account, container) == expected


@pytest.mark.parametrize("form", ["az", "abfss"])
def test_a_sas_token(account, spec, expected, monkeypatch, form):
    container = account.new_container()
    monkeypatch.setenv("AZURE_STORAGE_SAS_KEY", _sas(container, timedelta(hours=1), read=True, add=True, create=True,
                                                      write=True, delete=True, list=True))
    url = f"az://{container}/m" if form == "az" else f"abfss://{container}/m"  # the account from AZURE_STORAGE_ACCOUNT_NAME
    assert main(["init", spec, *ARGS, "--out", url]) == 0
    assert _written(account, container) == expected


@pytest.mark.parametrize("case", ["read-only", "expired"])
def test_a_sas_that_may_not_write_is_one_line_naming_the_settings(account, spec, monkeypatch, capsys, case):
    container = account.new_container()
    if case == "read-only":
        token = _sas(container, timedelta(hours=1), read=True, list=True)
    else:
        token = _sas(container, -timedelta(hours=1), read=True, add=True, create=True, write=True, delete=True, list=True)
    monkeypatch.setenv("AZURE_STORAGE_SAS_KEY", token)
    assert main(["init", spec, *ARGS, "--out", f"az://{container}/m"]) == 1
    line = _one_line(capsys)
    assert "access denied (Authorization" in line and "AZURE_STORAGE_SAS_KEY" in line and "AWS_" not in line, line
    signature = dict(p.split("=", 1) for p in token.split("&"))["sig"]
    assert signature not in line and token not in line
    assert _written(account, container) == {}


def test_the_abfss_form_with_the_account_in_the_host(azure_env, spec, expected):
    container = azure_env.new_container()
    url = f"abfss://{container}@{ACCOUNT}.dfs.core.windows.net/m"
    assert main(["init", spec, *ARGS, "--out", url]) == 0
    assert main(["verify", url, "--no-regenerate"]) == 0
    assert _written(azure_env, container) == expected


@pytest.mark.parametrize("url, says", [
    ("abfss://user:hunter2@account.dfs.core.windows.net/m", "credentials in the URL are not taken"),
    ("az://user:hunter2@container/m", "credentials in the URL are not taken"),
    ("abfss://ckpt@evil.example.com/m", "takes an account's endpoint as HOST"),
], ids=["abfss-userinfo", "az-userinfo", "abfss-foreign-host"])
def test_refused_url_forms_are_one_line_and_echo_no_secret(azure_env, spec, capsys, url, says):
    assert main(["init", spec, *ARGS, "--out", url]) == 2
    line = _one_line(capsys)
    assert says in line and "hunter2" not in line, line
