"""Every policy example of the docs (README.md, docs/*.md) loads, plans, and does what a policy
should: YAML/JSON blocks that are policy documents, and the Python ``Policy(...)`` examples.
No example's random (weight) rule may draw a bias: a rule on roles such as ``attn_out`` without
``params: [weight]`` also randomizes GPT-2's ``c_proj`` biases."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from modelinit_wire import policy_file
from modelinit_wire.v1 import modelinit_pb2 as pb

from tests.support import TINY
from tests.support.doc_blocks import all_blocks

#: Models each example is planned against: presets and tiny configs with biases everywhere (GPT-2's
#: c_proj, BERT's dense layers) and without (Llama).
MODELS = {"gpt2": "gpt2", "tiny-gpt2": TINY["gpt2"], "tiny-bert": TINY["bert"], "tiny-llama": TINY["llama"]}


def _blocks():
    for b in all_blocks():
        yield b.where, b.lang, b.text


def _policy_examples() -> list[tuple[str, pb.Policy]]:
    """(where, policy) for every policy example of the docs."""
    out = []
    for where, lang, body in _blocks():
        if lang in ("yaml", "yml", "json"):
            if not re.search(r"""^\s*["']?(rules|preset)["']?\s*:""", body, re.M):
                continue  # not a policy document (k8s manifests, explain --json output, ...)
            doc = json.loads(body) if lang == "json" else yaml.safe_load(body)
            if isinstance(doc, dict) and set(doc) <= {"preset", "rules"}:
                out.append((where, policy_file.from_dict(doc)))
        elif lang == "python" and "Policy(" in body:
            namespace: dict = {}
            exec(compile(body, where, "exec"), namespace)  # noqa: S102 - the docs' own examples
            policies = [v for v in namespace.values() if isinstance(v, pb.Policy)]
            assert policies, f"{where}: the Python example builds no Policy"
            out += [(where, p) for p in policies]
    return out


EXAMPLES = _policy_examples()


def test_the_docs_have_policy_examples():
    wheres = [w for w, _ in EXAMPLES]
    assert any(w.startswith("README.md") for w in wheres), wheres  # the typed Policy(...) example
    assert any(w.startswith("docs/policies.md") for w in wheres), wheres  # the YAML policy file
    assert all(p.rules for _, p in EXAMPLES)


def _rule_names(policy: pb.Policy) -> dict[str, pb.Rule]:
    return {r.name or f"rule[{i}]": r for i, r in enumerate(policy.rules)}


@pytest.mark.parametrize("where, policy", EXAMPLES, ids=[w for w, _ in EXAMPLES])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_example_plans_and_leaves_biases_alone(embedded, where, policy, model):
    plan = embedded.plan(MODELS[model], policy=policy, tensors=True)  # loads and plans: every tensor matched
    own = _rule_names(policy)
    random_biases = [f"{t.name} ({t.rule}: {t.init})" for t in plan.tensors
                     if t.param == "bias" and t.rule in own and not t.init.startswith("constant")]
    assert not random_biases, f"{where}: a weight rule draws biases: {random_biases[:3]}"
    # The examples' own rules do apply somewhere (an example whose rules match nothing shows nothing).
    assert any(t.rule in own for t in plan.tensors), f"{where}: no tensor of {model} takes the example's rules"


@pytest.mark.parametrize("where, policy", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_weight_rules_say_weight(where, policy):
    """Statically too: a random rule on roles (or on everything) names ``params: [weight]``."""
    for name, rule in _rule_names(policy).items():
        if rule.init.WhichOneof("kind") == "constant":
            continue
        m = rule.match
        only_weights = list(m.params) == ["weight"] or (m.names and all(g.endswith(".weight") for g in m.names))
        bias_free_kinds = m.kinds and set(m.kinds) <= {"embedding"}
        assert only_weights or bias_free_kinds, f"{where}: rule {name!r} ({policy_file.to_dict(policy)}) may match biases"


@pytest.mark.parametrize("where, policy", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_round_trips_through_the_policy_file_format(where, policy):
    assert policy_file.from_dict(policy_file.to_dict(policy)) == policy
