"""The architecture census in CI: every model type transformers knows, shrunk, initialized by
modelinit and loaded back by transformers (tests/support/census.py says how). It prints the count and every
refusal with its reason, and fails if a single buildable type does not pass (the README's claim:
all of them, 541 with transformers 5.24), or if the shrink stops making most types buildable (the
census would then prove little)."""
from __future__ import annotations

import pytest

from tests.support import census

#: Types transformers must build from the shrunk defaults (541 of 628 with a model class, transformers 5.24).
MIN_BUILDABLE = 500


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELINIT_CACHE_DIR", str(tmp_path_factory.mktemp("spec-cache")))
        return census.run()


def test_census_share(result, capsys):
    with capsys.disabled():
        print("\n" + result.report())
    buildable = len(result.outcomes) - len(result.of("unbuildable"))
    assert buildable >= MIN_BUILDABLE, f"only {buildable} types build from the shrunk defaults"
    assert result.of("refused") + result.of("fail") == [], result.report()  # every buildable type passes
    assert result.share == 1.0, result.report()


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
