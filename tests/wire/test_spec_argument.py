"""The spec argument, read by one rule on both sides (``modelinit_wire.spec_argument``): the
client's request (``modelinit.request.model_spec``) and ``init_module_``'s ``spec_of`` name the
same thing for every form, and fail alike on a config file they cannot read."""
from __future__ import annotations

import json
import pathlib

import grpc
import pytest
from modelinit import ModelInitError
from modelinit.request import model_spec
from modelinit_server import architectures
from modelinit_server.training import spec_of
from modelinit_wire.spec_argument import Config, Preset, read_spec_argument

CONFIG = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 128, "vocab_size": 100}


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIG))
    return path


def _forms(path: pathlib.Path):
    return {"preset": "bert-base-uncased", "dict": CONFIG, "file": str(path), "folder": str(path.parent),
            "pathlike": path, "folder pathlike": path.parent}


@pytest.mark.parametrize("form", ["preset", "dict", "file", "folder", "pathlike", "folder pathlike"])
def test_both_sides_name_the_same_spec(form, config_file):
    given = _forms(config_file)[form]
    message = model_spec(given)
    client_side = (architectures.from_preset(message.preset) if message.preset
                   else architectures.from_config(message.config_json))
    assert spec_of(given) == client_side
    assert isinstance(read_spec_argument(given), Preset if form == "preset" else Config)


@pytest.mark.parametrize("make", [
    lambda d: d / "absent.json",  # a .json path that is not there
    lambda d: d,                  # a folder with no config.json
    lambda d: (d / "latin1.json").write_bytes(b'{"model_type": "bert", "name": "\xe9"}') and d / "latin1.json",
], ids=["missing", "folder without config.json", "not UTF-8"])
def test_an_unreadable_config_file_is_one_error_naming_spec_on_both_sides(make, tmp_path):
    path = make(tmp_path)
    with pytest.raises(ModelInitError) as caught:
        model_spec(str(path))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(caught.value.details).startswith("spec: cannot read config file")
    # init_module_ said UnicodeDecodeError, not a ValueError naming spec, on the file not in UTF-8
    with pytest.raises(ValueError, match=r"^spec: cannot read config file"):
        spec_of(str(path))


@pytest.mark.parametrize("given", [42, 1.5, None, ["bert"]])
def test_a_spec_of_another_type_names_the_forms(given):
    with pytest.raises(ModelInitError, match="spec: give a preset name, a config.json path or a config dict"):
        model_spec(given)
    with pytest.raises(ValueError, match="spec: give a preset name, a config.json path or a config dict"):
        spec_of(given)
