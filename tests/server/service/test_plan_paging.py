"""Plans that scale: a Plan is a summary unless tensors are asked for, page by page, so a model of
any size plans through a stock gRPC client (4 MiB default receive limit)."""
from __future__ import annotations

import json

import grpc
import modelinit
import modelinit.client as mc
import modelinit.sources.protocol
import pytest
from modelinit import ModelInitError
from modelinit.cli import main as cli_main
from modelinit_server.service.embedded import EmbeddedService
from modelinit_wire.v1 import modelinit_pb2 as pb
from modelinit_wire.v1 import modelinit_pb2_grpc as pb_grpc

from tests.support import TINY

#: 14,403 tensors whose TensorPlans add up to ~4.7 MiB, over gRPC's default receive limit. (Each
#: carries its rule's name: a long one makes the list as big as a 671B MoE's ~90,000 tensors'
#: in a fraction of the planning time.)
HUGE = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 1,
        "num_hidden_layers": 1600, "vocab_size": 16}
HUGE_POLICY = {"rules": [{"name": "every tensor " + "x" * 187, "match": {}, "init": {"normal": {"std": 0.02}}}]}
HUGE_TENSORS = 1 + 9 * 1600 + 2  # embeddings, 9 per layer, final norm, lm_head
#: The request `modelinit plan huge.json --policy P --server T` sends (the server's plan cache serves it).
HUGE_REQUEST = mc.model_request(HUGE, seed=0, policy=HUGE_POLICY, dtype="float32", max_shard_size="5GB")


def _request(cfg=TINY["llama"], seed: int = 1) -> pb.ModelRequest:
    return mc.model_request(cfg, seed=seed, max_shard_size="100KB")  # tiny llama: several shards


@pytest.fixture()
def stub(server_target):
    """A stock stub: a plain channel with gRPC's default options (4 MiB receive limit)."""
    with grpc.insecure_channel(server_target) as channel:
        yield pb_grpc.ModelInitStub(channel)


def _pages(plan, request: pb.ModelRequest, page_size: int) -> list[pb.PlanResponse]:
    pages, token = [], ""
    while True:
        pages.append(plan(pb.PlanRequest(request=request, page_size=page_size, page_token=token)))
        token = pages[-1].next_page_token
        if not token:
            return pages


def _without_tensors(plan: pb.PlanResponse) -> pb.PlanResponse:
    out = pb.PlanResponse()
    out.CopyFrom(plan)
    out.ClearField("tensors")
    out.ClearField("next_page_token")
    return out


def _invalid(stub, request: pb.ModelRequest, **page) -> str:
    with pytest.raises(grpc.RpcError) as e:
        stub.Plan(pb.PlanRequest(request=request, **page), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return e.value.details()


# The huge model's tests come first and together: the server keeps the latest plans.

@pytest.mark.slow
def test_a_huge_plan_pages_through_a_stock_stub(stub):
    summary = stub.Plan(pb.PlanRequest(request=HUGE_REQUEST), timeout=60)
    assert not summary.tensors and summary.tensor_count == HUGE_TENSORS and not summary.next_page_token
    assert summary.ByteSize() < 64 << 10 and summary.groups and summary.files and summary.total_params > 0

    pages = _pages(lambda r: stub.Plan(r, timeout=60), HUGE_REQUEST, 10_000)
    assert [len(p.tensors) for p in pages] == [10_000, HUGE_TENSORS - 10_000]
    assert sum(p.ByteSize() for p in pages) > 4 << 20  # one unpaged response would not pass the stock limit
    for p in pages:  # every page carries the complete rest of the plan
        assert _without_tensors(p) == summary

    # Exactly the in-process plan's tensors, in order, with their shards and offsets.
    plan = EmbeddedService().build(HUGE_REQUEST)
    got = [(t.name, tuple(t.shape), t.shard, t.offset, t.nbytes) for p in pages for t in p.tensors]
    assert got == [(t.spec.name, tuple(t.spec.shape), t.file, t.offset, t.nbytes) for t in plan.tensors]


def test_cli_plan_of_a_huge_model(server_target, tmp_path, capsys):
    path, policy = tmp_path / "config.json", tmp_path / "policy.json"
    path.write_text(json.dumps(HUGE))
    policy.write_text(json.dumps(HUGE_POLICY))
    args = ["plan", str(path), "--policy", str(policy), "--server", server_target]
    assert cli_main([*args, "--no-tensors"]) == 0
    out = capsys.readouterr().out
    assert f"{HUGE_TENSORS:,} tensors" in out and "model.layers.0." not in out
    assert cli_main(args) == 0  # lists every tensor, paged
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + HUGE_TENSORS and lines[-2].startswith("model.norm.weight") and lines[-1].startswith("lm_head.weight")


def test_client_merges_pages_remote_and_embedded(client, monkeypatch):
    monkeypatch.setattr(modelinit.sources.protocol, "PLAN_PAGE_SIZE", 3)  # many pages of a tiny model
    kwargs = dict(seed=1, max_shard_size="100KB")
    summary = client.plan(TINY["llama"], **kwargs)
    assert not summary.tensors and summary.tensor_count > 3 * 5
    remote = client.plan(TINY["llama"], tensors=True, **kwargs)
    embedded = modelinit.Client().plan(TINY["llama"], tensors=True, **kwargs)
    assert remote == embedded and not remote.next_page_token
    assert len(remote.tensors) == remote.tensor_count == summary.tensor_count
    assert _without_tensors(remote) == summary
    plan = EmbeddedService().build(_request())
    assert [(t.name, t.shard, t.offset) for t in remote.tensors] == [(t.spec.name, t.file, t.offset) for t in plan.tensors]
    assert modelinit.Client().plan(TINY["llama"], **kwargs) == summary  # embedded summary: the same


@pytest.mark.parametrize("page_size", [1, 2, 7, 23, 10_000])
def test_any_page_size_lists_each_tensor_once(page_size):
    engine = EmbeddedService()
    request = _request()
    full = [t.spec.name for t in engine.build(request).tensors]
    pages = _pages(lambda r: engine.plan(r.request, r.page_size, r.page_token), request, page_size)
    assert [t.name for p in pages for t in p.tensors] == full
    assert all(len(p.tensors) == page_size for p in pages[:-1]) and 0 < len(pages[-1].tensors) <= page_size


def test_page_size_over_the_limit_is_refused(stub):
    details = _invalid(stub, _request(), page_size=10_001)
    assert details.startswith("page_size") and "10000" in details
    with pytest.raises(ValueError, match="^page_size"):
        EmbeddedService().plan(_request(), 10_001)


def test_a_token_of_another_request_is_refused(stub):
    token = stub.Plan(pb.PlanRequest(request=_request(seed=1), page_size=3), timeout=60).next_page_token
    assert token
    assert stub.Plan(pb.PlanRequest(request=_request(seed=1), page_size=3, page_token=token), timeout=60).tensors
    for other in (_request(seed=2), _request(TINY["gpt2"], seed=1), mc.model_request(TINY["llama"], seed=1)):
        details = _invalid(stub, other, page_size=3, page_token=token)
        assert details.startswith("page_token") and "same request" in details
    # The embedded engine refuses it alike.
    with pytest.raises(ValueError, match="^page_token"):
        EmbeddedService().plan(_request(seed=2), 3, token)


@pytest.mark.parametrize("token", ["garbage", "3", "3.", ".0123456789abcdef", "-3.0123456789abcdef", "0.0123456789abcdef",
                                   "99999.0123456789abcdef", "３.0123456789abcdef", "1" * 100, "tampered"])
def test_a_malformed_token_is_refused(stub, token):
    if token == "tampered":  # a real token with another offset
        real = stub.Plan(pb.PlanRequest(request=_request(), page_size=3), timeout=60).next_page_token
        token = "4" + real[real.index("."):]
    details = _invalid(stub, _request(), page_size=3, page_token=token)
    assert details.startswith("page_token")


def test_client_reports_a_bad_page_as_invalid_argument():
    c = modelinit.Client()
    with pytest.raises(ModelInitError) as e:
        c.source.plan(_request(), 3, "garbage")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("page_token")


def test_a_summary_lists_nothing_even_with_a_token(stub):
    token = stub.Plan(pb.PlanRequest(request=_request(), page_size=3), timeout=60).next_page_token
    page = stub.Plan(pb.PlanRequest(request=_request(), page_size=0, page_token=token), timeout=60)
    assert not page.tensors and not page.next_page_token and page.tensor_count > 0
