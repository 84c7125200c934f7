"""Store credentials from files (modelinit.store_secrets): a folder named by MODELINIT_STORE_SECRETS,
one file per setting as a mounted Kubernetes Secret gives it, read over the environment's settings.
Against S3 (moto behind a proxy that refuses any key but the test's: tests/support/s3_server.py) through
the CLI and the real libraries; the folder's refusals each one line naming the file, never a value.
Azure's account key from a file is in test_azure_settings.py."""
from __future__ import annotations

import grpc
import pytest
from modelinit import store_secrets
from modelinit.bucket import Bucket
from modelinit.cli import main
from modelinit.errors import ModelInitError

from tests.support.s3_server import KEYS
from tests.support.stores import CLI_ARGS as ARGS
from tests.support.stores import cli_expected, cli_spec  # noqa: F401 - the spec and expected fixtures

pytest.importorskip("obstore")


def _secret(folder, **settings: str):
    """``folder`` laid out as a Secret mounted as a volume: each key a file (through the
    ``..data`` link Kubernetes makes, whose dot-names are skipped)."""
    data = folder / "..2026_11_28_00_00_00.000000001"
    data.mkdir(parents=True)
    (folder / "..data").symlink_to(data.name)
    for k, v in settings.items():
        (data / k).write_text(v + "\n")
        (folder / k).symlink_to(f"..data/{k}")
    return folder


@pytest.fixture()
def wrong_key_in_env(s3_checking_keys, monkeypatch):
    """The environment points at the proxy with a key it refuses."""
    server, refused = s3_checking_keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-elses-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "someone-elses-secret")
    return server, refused


@pytest.mark.slow
def test_keys_from_the_files_override_the_environment(wrong_key_in_env, tmp_path, spec, expected, monkeypatch, capsys):
    server, refused = wrong_key_in_env
    bucket = server.new_bucket()
    assert main(["init", spec, *ARGS, "--out", f"s3://{bucket}/m"]) == 1  # the control: the env's key is refused
    assert "InvalidAccessKeyId" in capsys.readouterr().err and refused
    monkeypatch.setenv(store_secrets.ENV, str(_secret(tmp_path / "store", **KEYS, AZURE_STORAGE_ACCOUNT_KEY="not-for-s3")))
    refused.clear()
    assert main(["init", spec, *ARGS, "--out", f"s3://{bucket}/m"]) == 0
    assert server.keys(bucket, "m/") == expected and not refused


@pytest.mark.slow
def test_boto3_aborts_a_killed_runs_uploads_with_the_files_keys(wrong_key_in_env, tmp_path, monkeypatch):
    """boto3 (the one call obstore cannot make) takes the files' keys too."""
    server, refused = wrong_key_in_env
    bucket = server.new_bucket()
    server.admin.create_multipart_upload(Bucket=bucket, Key="m/model-00001-of-00002.safetensors")
    monkeypatch.setenv(store_secrets.ENV, str(_secret(tmp_path / "store", **KEYS)))
    assert Bucket(f"s3://{bucket}/m").abort_pending(["model-00001-of-00002.safetensors"]) == 1
    assert server.pending_uploads(bucket) == [] and not refused


def test_a_refused_key_names_the_files(wrong_key_in_env, tmp_path, spec, monkeypatch, capsys):
    server, _ = wrong_key_in_env
    folder = _secret(tmp_path / "store", AWS_ACCESS_KEY_ID="a-wrong-key-id", AWS_SECRET_ACCESS_KEY="a-wrong-secret")
    monkeypatch.setenv(store_secrets.ENV, str(folder))
    assert main(["init", spec, *ARGS, "--out", f"s3://{server.new_bucket()}/m"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "access denied (InvalidAccessKeyId)" in err, err
    assert f"AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY from the files of {store_secrets.ENV}={folder}" in err
    assert "a-wrong-secret" not in err


@pytest.mark.parametrize("lay_out, says", [
    (lambda d: (d / "AWS_SECRET_ACCES_KEY").write_text("x"),  # a typo is still AWS_...: obstore knows no such setting
     "MODELINIT_STORE_SECRETS: AWS_SECRET_ACCES_KEY is no setting of the s3:// store"),
    (lambda d: (d / "aws_access_key_id").write_text("x"), "'aws_access_key_id' in "),
    (lambda d: (d / "SECRET").write_text("x"), "'SECRET' in "),
    (lambda d: (d / "AWS_REGION").write_text("\n"), "AWS_REGION is empty"),
    (lambda d: (d / "AWS_REGION").mkdir(), "AWS_REGION is a folder"),
    (lambda d: (d / "AWS_SESSION_TOKEN").write_bytes(b"\xff\xfe"), "AWS_SESSION_TOKEN is not UTF-8 text"),
    (lambda d: (d / "AWS_SESSION_TOKEN").write_bytes(b"x" * (store_secrets.MAX_BYTES + 1)), "AWS_SESSION_TOKEN is over 64 KiB"),
    (lambda d: (d / "AWS_REGION").symlink_to("AWS_REGION"), "cannot read AWS_REGION"),
])
def test_a_folder_that_is_not_settings_is_refused_by_name(tmp_path, monkeypatch, lay_out, says):
    folder = tmp_path / "store"
    folder.mkdir()
    lay_out(folder)
    monkeypatch.setenv(store_secrets.ENV, str(folder))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # never reached
    with pytest.raises(ModelInitError) as e:
        Bucket("s3://b/m")
    assert "\n" not in e.value.details and says in e.value.details, e.value.details


def test_a_missing_folder_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(store_secrets.ENV, str(tmp_path / "absent"))
    with pytest.raises(ModelInitError) as e:
        Bucket("s3://b/m")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{store_secrets.ENV}: {str(tmp_path / 'absent')!r} is not a folder" in str(e.value)


def test_only_the_urls_stores_settings_are_taken(tmp_path, monkeypatch):
    folder = _secret(tmp_path / "store", AWS_REGION="eu-west-1", AZURE_STORAGE_ACCOUNT_NAME="acct",
                     GOOGLE_SERVICE_ACCOUNT_KEY='{"type": "service_account"}')
    monkeypatch.setenv(store_secrets.ENV, str(folder))
    assert store_secrets.read("s3") == {"AWS_REGION": "eu-west-1"}
    assert store_secrets.read("abfss") == {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}
    assert store_secrets.read("gs") == {"GOOGLE_SERVICE_ACCOUNT_KEY": '{"type": "service_account"}'}
    monkeypatch.delenv(store_secrets.ENV)
    assert store_secrets.read("s3") == {}


def test_a_value_never_reaches_a_message(tmp_path, monkeypatch):
    """obstore quotes a value it cannot parse; a file's value is replaced before the message is made."""
    folder = _secret(tmp_path / "store", AWS_REGION="us-east-1", AWS_DEFAULT_REGION="secret-looking-value",
                     AWS_CONDITIONAL_PUT="secret-looking-value")
    monkeypatch.setenv(store_secrets.ENV, str(folder))
    with pytest.raises(ModelInitError) as e:
        Bucket("s3://b/m")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "secret-looking-value" not in e.value.details
    assert "***" in e.value.details, e.value.details
    assert store_secrets.redact("bad value 'abcd1234' for key", {"K": "abcd1234"}) == "bad value '***' for key"


def test_client_options_go_apart_without_the_prefix(tmp_path, monkeypatch):
    """``AWS_ALLOW_HTTP`` and the other client options: obstore takes them as client options (in its
    configuration, obstore 0.12.1 panics)."""
    settings = {"AWS_ALLOW_HTTP": "true", "AWS_TIMEOUT": "30s", "AWS_REGION": "eu-west-1"}
    assert store_secrets.obstore_options(settings) == {"config": {"aws_region": "eu-west-1"},
                                                       "client_options": {"allow_http": "true", "timeout": "30s"}}
    monkeypatch.setenv(store_secrets.ENV, str(_secret(tmp_path / "store", AWS_ALLOW_HTTP="true", AZURE_ALLOW_HTTP="true",
                                                      AZURE_STORAGE_ACCOUNT_NAME="acct")))
    assert Bucket("s3://b/m").store.client_options == {"allow_http": "true"}
    assert Bucket("az://c/m").store.client_options == {"allow_http": "true"}


def test_boto3_arguments():
    got = store_secrets.boto3_arguments({"AWS_ACCESS_KEY_ID": "i", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
                                         "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "eu-west-1",
                                         "AWS_ENDPOINT_URL": "http://e", "AWS_ALLOW_HTTP": "true"})
    assert got == {"aws_access_key_id": "i", "aws_secret_access_key": "s", "aws_session_token": "t",
                   "region_name": "eu-west-1", "endpoint_url": "http://e"}
