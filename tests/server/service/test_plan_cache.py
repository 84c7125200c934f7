"""Plans of recent requests (``service.plans.PlanCache``): a request planned once is not planned
again, a new seed of a recent request is planned without resolving its policy again, and what
comes out is the plan a fresh build makes, byte for byte."""
from __future__ import annotations

import json

import pytest
from modelinit_server.core import planner
from modelinit_server.core.planner import build_plan
from modelinit_server.messages import request_from_pb
from modelinit_server.service.plans import PlanCache
from modelinit_wire.v1 import modelinit_pb2 as pb

from tests.support import TINY


def _msg(seed: int, policy: str = "hf-default", dtype: str = "") -> pb.ModelRequest:
    return pb.ModelRequest(spec=pb.ModelSpec(config_json=json.dumps(TINY["llama"])), seed=seed,
                           policy=pb.Policy(preset=policy), dtype=dtype)


def _same(a, b) -> bool:
    """Two plans alike in everything their bytes come from: files, headers, each tensor's key and sampler."""
    return (a.fingerprint == b.fingerprint and [(f.name, f.size, f.header, f.content) for f in a.files]
            == [(f.name, f.size, f.header, f.content) for f in b.files]
            and [(t.key, t.resolved.sampler, t.file, t.offset) for t in a.tensors]
            == [(t.key, t.resolved.sampler, t.file, t.offset) for t in b.tensors])


@pytest.fixture
def resolutions(monkeypatch):
    """Every call of the policy resolution, by the plan's builders."""
    calls = []
    real = planner.resolve

    def counted(policy, model):
        calls.append(policy.preset)
        return real(policy, model)

    monkeypatch.setattr(planner, "resolve", counted)
    return calls


def test_a_new_seed_reuses_the_resolution_and_plans_what_a_fresh_build_plans(resolutions):
    cache = PlanCache()
    first = cache.build(_msg(1))
    assert cache.build(_msg(1)) is first and cache.cached(_msg(1)) is first  # the same request: kept whole
    second = cache.build(_msg(2))
    assert resolutions == ["hf-default"]  # the seed changed nothing the resolution depends on
    assert second.fingerprint != first.fingerprint
    fresh = build_plan(request_from_pb(_msg(2)))
    assert _same(second, fresh) and second.request == fresh.request
    cache.build(_msg(2, dtype="bfloat16"))  # another request: resolved anew
    cache.build(_msg(3, policy="gpt2"))
    assert resolutions == ["hf-default", "hf-default", "hf-default", "gpt2"]


def test_a_request_refused_is_not_kept(resolutions):
    cache = PlanCache()

    def refuse(plan):
        raise ValueError("max_params: over the cap")

    with pytest.raises(ValueError, match="max_params"):
        cache.build(_msg(1), check=refuse)
    assert cache.cached(_msg(1)) is None
    assert cache.build(_msg(1)) is not None  # without the check it plans (the resolution was kept)
    assert resolutions == ["hf-default"]


def test_only_the_latest_are_kept():
    cache = PlanCache(plans=1, resolutions=1)
    cache.build(_msg(1))
    cache.build(_msg(2, policy="gpt2"))
    assert cache.cached(_msg(1)) is None and cache.cached(_msg(2, policy="gpt2")) is not None
