"""The client's token from a file: ``MODELINIT_TOKEN=@PATH`` (what deploy/examples/training-job.yaml
sets, with the modelinit-token Secret mounted at PATH) reads the token from the file, as
``modelinit serve --token=@PATH`` does; the Secret never becomes an environment variable."""
from __future__ import annotations

import json

import pytest
from modelinit.cli import main

TOKEN = "file-token-0123456789abcdef"


@pytest.fixture()
def server(background_server):
    return background_server(token=TOKEN)


def plan(server, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["plan", "gpt2", "--server", server.target, "--no-tensors", "--json", "--retry-deadline", "0"])
    out, err = capsys.readouterr()
    return code, out, err


def test_env_at_path_reads_the_token_file(server, tmp_path, monkeypatch, capsys):
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # a Secret made --from-file often ends in a newline
    monkeypatch.setenv("MODELINIT_TOKEN", f"@{secret}")
    code, out, err = plan(server, capsys)
    assert code == 0, err
    assert json.loads(out)["architecture"] == "GPT2LMHeadModel"


def test_env_path_without_at_is_the_token_itself(server, tmp_path, monkeypatch, capsys):
    secret = tmp_path / "token"
    secret.write_text(TOKEN)
    monkeypatch.setenv("MODELINIT_TOKEN", str(secret))  # sent as it is: the server refuses it
    code, _, err = plan(server, capsys)
    assert code == 1 and "invalid bearer token" in err


def test_missing_token_file_is_one_line_naming_it(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MODELINIT_TOKEN", f"@{tmp_path / 'nope'}")
    code, _, err = plan(server, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("modelinit: error: token: cannot read token file") and "nope" in line
