"""The architecture census in CI: every model type transformers knows, shrunk, initialized by
modelinit and loaded back by transformers (tests/support/census.py says how). It prints the count and every
refusal with its reason, and fails if a single buildable type does not pass (the README's claim:
all of them, 549 with transformers 5.24), or if the shrink stops making most types buildable (the
census would then prove little).

The census runs as ``CHUNKS`` parts, every ``CHUNKS``-th type each (``test_census_part``), so the
test processes of a parallel run share it; each part is run once per test run
(tests/support/once.py) and the whole-census checks read every part."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from tests.support import census
from tests.support.once import once

#: Parts of the census (about 80 types, 25 s on one core, each).
CHUNKS = 8

#: Types transformers must build from the shrunk defaults (549 of 628 with a model class, transformers 5.24).
MIN_BUILDABLE = 500


def _part(tmp_path_factory, k: int) -> census.Census:
    """Part ``k`` of the census: its outcomes, run once per test run."""
    def make(folder):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MODELINIT_CACHE_DIR", str(folder / "spec-cache"))
            done = census.run(census.model_types()[k::CHUNKS])
        (folder / "outcomes.json").write_text(json.dumps([asdict(o) for o in done.outcomes]))

    folder = once(tmp_path_factory, f"census-{k}-of-{CHUNKS}", make)
    return census.Census([census.Outcome(**o) for o in json.loads((folder / "outcomes.json").read_text())])


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> census.Census:
    """The whole census, its parts in order."""
    return census.Census([o for k in range(CHUNKS) for o in _part(tmp_path_factory, k).outcomes])


@pytest.mark.slow
@pytest.mark.parametrize("k", range(CHUNKS))
def test_census_part(tmp_path_factory, k):
    """Every buildable type of part ``k`` passes (a failure is reported by the part that holds it)."""
    part = _part(tmp_path_factory, k)
    assert part.outcomes and part.of("refused") + part.of("fail") == [], part.report()


def test_every_type_is_in_one_part():
    types = census.model_types()
    parts = [types[k::CHUNKS] for k in range(CHUNKS)]
    assert sorted(t for part in parts for t in part) == types


@pytest.mark.slow
@pytest.mark.reads_parts
def test_census_share(result, capsys):
    with capsys.disabled():
        print("\n" + result.report())
    buildable = len(result.outcomes) - len(result.of("unbuildable"))
    assert buildable >= MIN_BUILDABLE, f"only {buildable} types build from the shrunk defaults"
    assert result.of("refused") + result.of("fail") == [], result.report()  # every buildable type passes
    assert result.share == 1.0, result.report()


@pytest.mark.slow
@pytest.mark.reads_parts
def test_every_type_that_does_not_pass_names_a_reason(result):
    """Those transformers cannot build from a shrunk default config (hundreds: the check is not
    vacuous) and any refusal or failure each say why."""
    others = result.of("unbuildable") + result.of("refused") + result.of("fail")
    assert len(result.of("unbuildable")) > 0
    assert all(o.reason for o in others), [o for o in others if not o.reason]


def test_shrink_keeps_small_sizes_and_token_ids():
    doc = census.shrink({"vocab_size": 50257, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                         "num_key_value_heads": 12, "pad_token_id": 50256, "layer_types": ["full"] * 12,
                         "text_config": {"hidden_size": 1024, "num_hidden_layers": 24}})
    assert doc["hidden_size"] == 64 and doc["num_hidden_layers"] == 2 and doc["num_key_value_heads"] == 2
    assert doc["vocab_size"] == 256 and doc["pad_token_id"] == 255  # special ids moved inside the vocabulary
    assert doc["layer_types"] == ["full", "full"]
    assert doc["text_config"] == {"hidden_size": 64, "num_hidden_layers": 2}


def test_narrow_caps_the_sizes_the_tables_do_not_name():
    doc = census.narrow({"hidden_size": 64, "intermediate_size": 128, "hidden_sizes": [256, 512, 32], "image_size": 224,
                         "patch_size": 16, "num_channels": 3, "out_hidden_size": 4096, "max_position_embeddings": 4096,
                         "backbone_config": {"embed_dim": 96, "depths": [2, 2, 6, 2], "encoder_hidden_dim": 256}})
    assert doc["hidden_sizes"] == [64, 64, 32] and doc["image_size"] == 64 and doc["out_hidden_size"] == 64
    assert doc["patch_size"] == 16 and doc["num_channels"] == 3 and doc["max_position_embeddings"] == 4096
    assert doc["intermediate_size"] == 128  # a table's own size is the table's
    assert doc["backbone_config"] == {"embed_dim": 96, "depths": [2, 2, 6, 2], "encoder_hidden_dim": 64}  # shrink does embed_dim


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(census.NOT_NARROWED))
def test_a_type_left_unnarrowed_is_one_transformers_cannot_load_back(model_type, tmp_path):
    """The narrowed config of each type in NOT_NARROWED: transformers builds it, saves it, and its own
    from_pretrained fails on what it saved (so it cannot judge modelinit's folder). When a transformers
    release loads it, this fails: take the type off the list."""
    import transformers
    from modelinit_server.architectures import meta_models
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = getattr(transformers, meta_models.default_class(model_type))
    with census.quiet():
        base = CONFIG_MAPPING[model_type]().to_dict()
        document = census.narrow(census.shrink(base, False, census.VARIANTS[0]))
        config = CONFIG_MAPPING[model_type].from_dict({k: v for k, v in document.items() if k != "transformers_version"})
        cls(config).save_pretrained(tmp_path)
        with pytest.raises(RuntimeError, match="mismatched|conversion"):  # NOT_NARROWED[model_type] says which
            cls.from_pretrained(tmp_path)
