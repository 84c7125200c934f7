"""``init_module_`` on Megatron-Core's ``HybridModel`` (0.17 and later; 0.19 logs "GPTModel IS
DEPRECATED ... use HybridModel"): a pattern of attention (``*``), MLP (``-``) and MoE (``E``) layers,
filled with the bytes of the Hugging Face folder of the model it corresponds to, by position (layer
``i``'s attention at the ``i``-th ``*``, its MLP right after), with and without a spec, at TP=2 x
PP=2 (the pattern's ``|`` stages), EP=2, PP=2 x VP=2 and DP=2 under Megatron's FSDP2 wrapper.

These run where the Megatron-Core found has HybridModel: in CI, the newest release's run
(server/training/test_megatron_releases.py); the test extra's 0.16.1 has none. The model is built
from Megatron's local modules (Megatron ships only a Transformer Engine hybrid stack spec) with
HybridStack's hard-coded TENorm final norm swapped for the local RMSNorm while it is built
(tests/support/megatron_models.megatron_hybrid). The reference is the folder put into the hybrid
layout by the test's own conversion, and a sharded layout's tensors are put together by Megatron's
rules, as in test_megatron.py.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.megatron_models import (HYBRID_MOE, HYBRID_PATTERN, HYBRID_PP2, PADDED, SEED,  # noqa: E402
                                           chunks_hold_each_tensor_once, folder_in_hybrid_layout, fsdp2_wrapped, has_hybrid_model,
                                           in_one_process, init_group, megatron_hybrid, put_together)

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.slow,
              pytest.mark.skipif(not has_hybrid_model(), reason="this Megatron-Core has no HybridModel (0.17 and "
                                 "later have it; CI runs these on the newest release, test_megatron_releases.py)")]

#: The config derived from the model: HYBRID_MOE with Megatron's padded vocabulary.
DERIVED = {**HYBRID_MOE, "vocab_size": PADDED}


def _fill_twice(model) -> tuple[dict, dict]:
    """The model filled with the spec, then (poisoned in between) without one; each fill's tensors
    and the config derived."""
    states = []
    for spec in (HYBRID_MOE, None):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))
        with no_collectives():
            summary = modelinit.init_module_(model, seed=SEED, spec=spec)
        assert summary.architecture == "Qwen3MoeForCausalLM" and summary.elements == sum(p.numel() for p in model.parameters())
        states.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert summary.derived_config is not None
    derived = {k: summary.derived_config.get(k) for k in DERIVED if k != "architectures"}
    assert derived == {k: v for k, v in DERIVED.items() if k != "architectures"}, derived
    first, second = states
    assert [n for n in first if not same_bytes(first[n], second[n])] == []  # the derived config fills the same bytes
    return first, summary.derived_config


def _check_one_device(ref_path: str) -> None:
    ref = torch.load(ref_path)
    state, _ = _fill_twice(megatron_hybrid())
    assert sorted(state) == sorted(ref)
    assert [n for n in ref if not same_bytes(state[n], ref[n])] == []


def test_one_device_equals_the_folder_with_and_without_a_spec(tmp_path):
    """``*-*E*-*E`` on one rank: every parameter (the padded vocabulary's rows, the dense and the MoE
    layers' MLPs, the final norm) is the folder's bytes by position; without a spec the config derived
    is the Qwen3-MoE of those layers (``mlp_only_layers`` the ``-`` ones) and fills the same bytes."""
    ref_path = str(tmp_path / "ref.pt")
    torch.save(folder_in_hybrid_layout(tmp_path), ref_path)
    in_one_process(str(tmp_path / "pg"), _check_one_device, ref_path)


def _fill_layout(rank: int, world: int, init_file: str, tp: int, pp: int, ep: int, out: str) -> None:
    from megatron.core import parallel_state as ps

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    model = megatron_hybrid(tp, pp, ep, pattern=HYBRID_PP2 if pp > 1 else HYBRID_PATTERN)
    state, _ = _fill_twice(model)
    torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
                "first": model.decoder.layers[0].layer_number - 1, "state": state}, f"{out}/rank{rank}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("tp, pp, ep", [(2, 2, 1), (1, 1, 2)], ids=["tp2-pp2", "ep2"])
def test_parallel_layouts_equal_the_folder(tmp_path, tp, pp, ep):
    """TP=2 x PP=2 over 4 ranks (``*-*E|*-*E``: each stage its 4 layers, saved under their global
    symbol index; each rank its query groups, [gate_r; up_r], half the padded vocabulary) and EP=2
    (each rank 2 of the 4 experts of each ``E``): each rank fills its share with and without a spec,
    and the shares put together are the folder's bytes."""
    ref = folder_in_hybrid_layout(tmp_path, HYBRID_PP2 if pp > 1 else HYBRID_PATTERN)
    out = tmp_path / "shares"
    out.mkdir()
    world = max(tp * pp, ep)
    spawn(_fill_layout, (world, str(tmp_path / "pg"), tp, pp, ep, str(out)), world)
    whole = put_together(out, world, ep)
    assert sorted(whole) == sorted(ref)
    assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []


#: Four segments: at PP=2 x VP=2, rank r's chunk v is segment v * 2 + r (Megatron's select_pipeline_segment).
HYBRID_VP = "*-|*E|*-|*E"


def _fill_chunks(rank: int, world: int, init_file: str, out: str) -> None:
    """This rank's 2 chunks of a PP=2 x VP=2 HybridModel (each with its ``vp_stage``), filled in one
    call without a spec (the rank's list of chunks, as Megatron's ``get_model`` returns it), then each
    by its own call with the spec; saved with the global symbol index of its first layer."""
    from megatron.core import parallel_state as ps

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(pipeline_model_parallel_size=world, virtual_pipeline_model_parallel_size=2)
    over = dict(pattern=HYBRID_VP, virtual_pipeline_model_parallel_size=2)
    chunks = [megatron_hybrid(pp=world, vp_stage=stage, **over) for stage in range(2)]
    with no_collectives():
        together = modelinit.init_module_(chunks, seed=SEED)
    assert len(together.parts) == 2 and all(p.derived_config["mlp_only_layers"] == [0, 2] for p in together.parts)
    for stage, derived in enumerate(chunks):
        model = megatron_hybrid(pp=world, vp_stage=stage, **over)
        with no_collectives():
            summary = modelinit.init_module_(model, seed=SEED, spec=HYBRID_MOE)
        assert summary.missing > 0
        got, again = dict(derived.named_parameters()), dict(model.named_parameters())
        assert sorted(got) == sorted(again) and all(same_bytes(got[n], again[n]) for n in got)
        torch.save({"first": model.decoder.layers[0].layer_number - 1,
                    "state": {n: p.detach().clone() for n, p in model.named_parameters()}}, f"{out}/rank{rank}-chunk{stage}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_virtual_pipeline_chunks_hold_the_folder_each_tensor_once(tmp_path):
    """PP=2 x VP=2 over ``*-|*E|*-|*E``: rank 0 holds segments 0 and 2 (symbols 0-1, 4-5), rank 1
    segments 1 and 3; over all ranks' chunks every stored tensor is in exactly one chunk, with the
    folder's bytes, with the spec and without it (each chunk derives the whole model's config)."""
    ref, out = folder_in_hybrid_layout(tmp_path, HYBRID_VP), tmp_path / "chunks"
    out.mkdir()
    spawn(_fill_chunks, (2, str(tmp_path / "pg"), str(out)), 2)
    holder = chunks_hold_each_tensor_once(out, ref)
    assert holder["decoder.layers.4.input_layernorm.weight"] == "rank0-chunk1"
    assert holder["decoder.layers.3.mlp.router.weight"] == "rank1-chunk0"


def _fill_fsdp2(rank: int, world: int, init_file: str, out: str) -> None:
    """This rank's FSDP2 shards (Megatron's ``--use-torch-fsdp2`` wrapper over DP=2, ``transformer_impl
    local``) filled with the spec and, in a second model, without one; each local shard the same
    bytes; the full tensors gathered by the test after the fill."""
    from megatron.core import parallel_state as ps
    from torch.distributed.tensor import DTensor

    init_group(rank, world, init_file)
    ps.initialize_model_parallel()
    model, derived = (fsdp2_wrapped(megatron_hybrid(transformer_impl="local")) for _ in range(2))
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec=HYBRID_MOE)
        own = modelinit.init_module_(derived, seed=SEED)
    params, again = dict(model.module.named_parameters()), dict(derived.module.named_parameters())
    assert params and all(isinstance(p, DTensor) for p in params.values())
    assert summary.elements == sum(p.to_local().numel() for p in params.values()) < summary.global_elements
    assert own.derived_config["mlp_only_layers"] == [0, 2]
    assert [n for n, p in params.items() if not same_bytes(p.to_local(), again[n].to_local())] == []
    state = {n: p.full_tensor().detach().clone() for n, p in params.items()}
    torch.save({"tp": 0, "ep": 0, "first": 0, "state": state}, f"{out}/rank{rank}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_fsdp2_shards_gathered_are_the_folder(tmp_path):
    """DP=2 under Megatron's FSDP2 wrapper (each rank the Shard(0) rows of every parameter, the
    experts' too, EP being 1): filled with and without a spec, the gathered tensors are the folder's."""
    ref, out = folder_in_hybrid_layout(tmp_path), tmp_path / "shares"
    out.mkdir()
    spawn(_fill_fsdp2, (2, str(tmp_path / "pg"), str(out)), 2)
    whole = put_together(out, 2, 1)
    assert sorted(whole) == sorted(ref)
    assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []
