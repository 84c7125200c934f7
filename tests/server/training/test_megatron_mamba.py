"""``init_module_`` on a Megatron-Core ``HybridModel`` with Mamba layers (``M``): filled with the bytes
of the Hugging Face Nemotron-H folder it corresponds to (``nemotron_h``, whose ``hybrid_override_pattern``
is Megatron's pattern, one layer per symbol), with and without a spec, at DP=2 under Megatron's FSDP2
wrapper, and at TP=2 x PP=2 x VP=2 (the pattern's ``|``, two model chunks per rank) with EP=2 beside
TP (the experts' TP 1); each Mamba mixer's ``in_proj`` and ``conv1d``, which Megatron saves as parts
(``z, x, B, C, dt`` and ``x, B, C``, each rank its rows of every part), included.

The model is built on CPU without ``mamba_ssm`` (tests/support/megatron_mamba.py says what is replaced
and why: only what serves the forward or asks CUDA; every parameter's shape, split and place is
Megatron's own). These run where the Megatron-Core found has HybridModel: in CI, the newest release's
run (test_megatron_releases.py). The pattern's mapping, which needs no Megatron, is checked first.
"""
from __future__ import annotations

import importlib.util

import pytest

from modelinit_server.training.megatron.hybrid import parse

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("pattern, by_symbol, message", [
    ("M*-+", None, "layer 3 is '+', a multi-latent attention layer"),
    ("M*G-", None, "layer 2 is 'G', a gated delta net layer"),
    ("*-M-", False, "layer 2 is a Mamba layer ('M'), in hybrid_layer_pattern '*-M-', which a Llama-style Hugging "
                    "Face family has none of; give a Nemotron-H spec"),
])
def test_a_pattern_nemotron_h_does_not_hold_is_refused_by_name(pattern, by_symbol, message):
    with pytest.raises(ValueError, match="^module: the HybridModel's") as e:
        parse(pattern, by_symbol)
    assert message in str(e.value)


def test_a_pattern_with_mamba_layers_is_one_nemotron_h_layer_per_symbol():
    mamba = parse("M*-|M*-")
    assert (mamba.by_symbol, mamba.symbols, mamba.hf_layers, mamba.layers) == (True, "M*-M*-", tuple(range(6)), 6)
    assert parse("M*EM*-").symbols == "M*EM*-"  # MoE beside Mamba: Nemotron-H's MoE layer
    pairs = parse("*-*E")  # without Mamba layers: attention-then-MLP pairs, as before
    assert (pairs.by_symbol, pairs.hf_layers, pairs.layers) == (False, (0, 0, 1, 1), 2)
    assert parse("*-*-", by_symbol=True).hf_layers == (0, 1, 2, 3)


def _need_hybrid_model() -> None:
    """Skip where the Megatron-Core found has no HybridModel (the test extra's 0.16.1)."""
    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is in the test extra")
    from tests.support.megatron_models import has_hybrid_model

    if not has_hybrid_model():
        pytest.skip("this Megatron-Core has no HybridModel (0.17 and later have it; CI runs these on the newest "
                    "release, test_megatron_releases.py)")


def _local(p):
    """A parameter's own elements: an FSDP2 DTensor's local shard, else the parameter."""
    return p.to_local() if hasattr(p, "to_local") else p


def _filled(model) -> dict:
    """What ``init_module_`` fills: the parameters and the routers' ``expert_bias`` buffers."""
    return {**dict(model.named_parameters()), **{n: b for n, b in model.named_buffers() if n.endswith(".expert_bias")}}


def _fill_twice(model) -> dict:
    """The model filled with NEMOTRON_H, then (poisoned in between) without a spec; the two fills' bytes
    must be the same, and the config derived NEMOTRON_H's. Returns the fill's (local) tensors."""
    import modelinit
    from tests.support.distributed import no_collectives, same_bytes
    from tests.support.megatron_mamba import NEMOTRON_H
    from tests.support.megatron_models import SEED

    states = []
    for spec in (NEMOTRON_H, None):
        with torch.no_grad():
            for p in _filled(model).values():
                _local(p).fill_(float("nan"))
        with no_collectives():
            summary = modelinit.init_module_(model, seed=SEED, spec=spec)
        assert summary.architecture == "NemotronHForCausalLM"
        assert summary.elements == sum(_local(p).numel() for p in _filled(model).values())
        states.append({n: _local(p).detach().clone() for n, p in _filled(model).items()})
    derived = summary.derived_config
    assert {k: derived.get(k) for k in NEMOTRON_H} == NEMOTRON_H, derived
    first, second = states
    assert [n for n in first if not same_bytes(first[n], second[n])] == []
    return first


def _refusals() -> None:
    """A spec of another pattern, a Llama-style spec, a Mamba hybrid with RoPE: each refused, nothing written."""
    import modelinit
    from tests.support.distributed import no_collectives, same_bytes
    from tests.support.megatron_mamba import NEMOTRON_H, megatron_mamba_hybrid
    from tests.support.megatron_models import SEED

    model = megatron_mamba_hybrid()
    refusals = (
        (model, {**NEMOTRON_H, "hybrid_override_pattern": "M*-M*E"}, "layers are 'M*EM*-' (its hybrid_layer_pattern "
         "without '|'), the spec's (NemotronHForCausalLM) are 'M*-M*E'"),
        (model, "tinyllama-1.1b", "layer 0 is a Mamba layer ('M')"),
        (megatron_mamba_hybrid(position_embedding_type="rope"), None,
         "position_embedding_type='rope' (positions in a hybrid model with Mamba layers"))
    for other, spec, message in refusals:
        before = [p.detach().clone() for p in other.parameters()]
        try:
            with no_collectives():
                modelinit.init_module_(other, seed=SEED, spec=spec)
        except ValueError as e:
            assert message in str(e), e
        else:
            raise AssertionError(f"{spec!r} was not refused")
        assert all(same_bytes(a, b.detach()) for a, b in zip(before, other.parameters()))  # nothing written


def _fill_fsdp2(rank: int, world: int, init_file: str, out: str) -> None:
    from megatron.core import parallel_state as ps

    from tests.support.distributed import exit_rank
    from tests.support.megatron_mamba import megatron_mamba_hybrid
    from tests.support.megatron_models import fsdp2_wrapped, init_group

    init_group(rank, world, init_file)
    ps.initialize_model_parallel()
    model = fsdp2_wrapped(megatron_mamba_hybrid(transformer_impl="local"))
    _fill_twice(model)
    torch.save({n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                for n, p in _filled(model.module).items()}, f"{out}/rank{rank}.pt")
    if rank == 0:
        _refusals()
    exit_rank()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fsdp2_shards_gathered_are_the_folder(tmp_path):
    """``M*-M*-`` at DP=2 under Megatron's FSDP2 wrapper (``--use-torch-fsdp2``: each rank the Shard(0) rows
    of every parameter): filled with the spec and without it (the config derived is NEMOTRON_H, the same
    bytes), every gathered parameter (each mixer's in_proj, conv1d, dt_bias, A_log, D, gated norm and
    out_proj; the attention's grouped QKV; the MLPs; each layer's one norm) is the Nemotron-H folder's
    bytes, layer k at symbol k. A spec of another pattern, a Llama-style spec and a Mamba hybrid with
    RoPE are refused, nothing written."""
    _need_hybrid_model()
    from tests.support.distributed import same_bytes, spawn
    from tests.support.megatron_mamba import folder_in_mamba_layout

    ref, out = folder_in_mamba_layout(tmp_path), tmp_path / "shares"
    out.mkdir()
    spawn(_fill_fsdp2, (2, str(tmp_path / "pg"), str(out)), 2)
    for rank in range(2):
        whole = torch.load(out / f"rank{rank}.pt")
        assert sorted(whole) == sorted(ref)
        assert [n for n in ref if not same_bytes(whole[n], ref[n])] == []


def _fill_chunks(rank: int, world: int, init_file: str, out: str) -> None:
    """This rank's 2 model chunks of ``M*|E|M*|-`` at TP=2 x PP=2 x VP=2 with EP=2 beside TP (the experts'
    TP 1), as Megatron's ``get_model`` returns them (a list, each chunk with its ``vp_stage``): filled in
    one call with the spec, then (poisoned in between) in one call without it; each chunk saved with its
    TP and EP ranks and the global index of its first layer."""
    import modelinit
    from megatron.core import parallel_state as ps

    from tests.support.distributed import exit_rank, no_collectives, same_bytes
    from tests.support.megatron_mamba import MAMBA_VP, NEMOTRON_H, megatron_mamba_hybrid
    from tests.support.megatron_models import SEED, init_group

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                 virtual_pipeline_model_parallel_size=2, expert_model_parallel_size=2,
                                 expert_tensor_parallel_size=1)
    chunks = [megatron_mamba_hybrid(2, 2, pattern=MAMBA_VP, vp_stage=stage, virtual_pipeline_model_parallel_size=2,
                                    expert_model_parallel_size=2, expert_tensor_parallel_size=1) for stage in range(2)]
    states = []
    for spec in (NEMOTRON_H, None):
        with torch.no_grad():
            for chunk in chunks:
                for p in _filled(chunk).values():
                    p.fill_(float("nan"))
        with no_collectives():
            summary = modelinit.init_module_(chunks, seed=SEED, spec=spec)
        assert summary.architecture == "NemotronHForCausalLM" and len(summary.parts) == 2
        assert summary.missing > 0  # the other stages' layers, the other EP rank's experts
        states.append([{n: p.detach().clone() for n, p in _filled(chunk).items()} for chunk in chunks])
    assert {k: summary.derived_config.get(k) for k in NEMOTRON_H} == NEMOTRON_H, summary.derived_config
    for stage, (first, second) in enumerate(zip(*states)):
        assert [n for n in first if not same_bytes(first[n], second[n])] == []
        torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
                    "first": chunks[stage].decoder.layers[0].layer_number - 1, "state": first},
                   f"{out}/rank{rank}-chunk{stage}.pt")
    exit_rank()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tp2_pp2_vp2_ep2_shares_put_together_are_the_folder(tmp_path):
    """``M*|E|M*|-`` over 4 processes at TP=2 x PP=2 x VP=2, with EP=2 beside TP=2 on each stage's two
    ranks (MoE parallel folding: the experts' TP 1). Each rank holds 2 model chunks (ranks 0-1 are pipeline
    stage 0, ranks 2-3 stage 1; stage s's chunk v is segment v * 2 + s): in them, its half of every Mamba head, group and channel (its rows of each part of
    in_proj and conv1d, of dt_bias, A_log, D and the gated norm; out_proj's columns), its query groups and
    half of each MLP and of the shared expert, and 2 of the 4 routed experts whole. Filled with and without
    a spec (the chunks together, as ``get_model`` returns them), the shares put together by Megatron's
    rules are the folder's bytes, each tensor from one chunk per TP rank."""
    _need_hybrid_model()
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from tests.support.distributed import same_bytes, spawn
    from tests.support.megatron_mamba import MAMBA_VP, folder_in_mamba_layout, put_mamba_together

    ref = folder_in_mamba_layout(tmp_path, MAMBA_VP)
    out = tmp_path / "shares"
    out.mkdir()
    spawn(_fill_chunks, (4, str(tmp_path / "pg"), str(out)), 4)
    firsts = {f.stem: torch.load(f)["first"] for f in out.glob("*.pt")}
    assert firsts == {"rank0-chunk0": 0, "rank1-chunk0": 0, "rank2-chunk0": 2, "rank3-chunk0": 2,
                      "rank0-chunk1": 3, "rank1-chunk1": 3, "rank2-chunk1": 5, "rank3-chunk1": 5}, firsts
    whole = put_mamba_together(out, ep=2)
    assert sorted(whole) == sorted(ref)
    assert [n for n in ref if not same_bytes(whole[n], ref[n])] == []


def _fill_te_spec(rank: int, world: int, init_file: str, out: str) -> None:
    """This rank's TP=2 share of ``M*EM*-`` built with Megatron's own Transformer Engine hybrid stack spec
    (over tests/support/megatron_te.py's stand-in of Transformer Engine): refused while its switches are
    off, nothing written; with them on, filled with and without a spec; saved under SequentialMLP's names."""
    import modelinit
    from megatron.core import parallel_state as ps

    from modelinit_server.training.megatron import refusals
    from tests.support.distributed import exit_rank, no_collectives, same_bytes
    from tests.support.megatron_mamba import megatron_mamba_hybrid
    from tests.support.megatron_models import SEED, init_group
    from tests.support.megatron_te import as_sequential_experts, transformer_engine_stand_in

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    with transformer_engine_stand_in():
        model = megatron_mamba_hybrid(world, te_spec=True)
    assert type(model.decoder.layers[0].mixer.in_proj).__name__ == "TELayerNormColumnParallelLinear"
    assert type(model.decoder.layers[2].mlp.experts).__name__ == "TEGroupedMLP"
    before = [p.detach().clone() for p in model.parameters()]
    try:
        with no_collectives():
            modelinit.init_module_(model, seed=SEED)
    except ValueError as e:
        assert "is Transformer Engine's TE" in str(e) and "which has not been verified on a GPU run yet" in str(e), e
    else:
        raise AssertionError("the Transformer Engine hybrid spec was not refused")
    assert all(same_bytes(a, b.detach()) for a, b in zip(before, model.parameters()))  # nothing written
    refusals.TE_LAYER_SPEC_VERIFIED = refusals.TE_GROUPED_EXPERTS_VERIFIED = True
    state = as_sequential_experts(_fill_twice(model))
    torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": 0, "first": 0, "state": state}, f"{out}/rank{rank}.pt")
    exit_rank()


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_transformer_engine_hybrid_spec_at_tp2_is_the_folder(tmp_path):
    """``M*EM*-`` built with Megatron's own Transformer Engine hybrid stack spec (``hybrid_stack_spec``,
    what Megatron ships for HybridModel: each layer's norm fused into the linear after it as
    ``layer_norm_weight``, Mamba's into ``in_proj``; TEGroupedMLP experts), its Transformer Engine modules
    stand-ins (Transformer Engine cannot be installed without CUDA), at TP=2: filled with and without a
    spec (Nemotron-H derived), the shares put together are the Nemotron-H folder's bytes, each norm under
    its fused name. Refused until a GPU run has verified the real layers, nothing written."""
    _need_hybrid_model()
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from tests.support.distributed import same_bytes, spawn
    from tests.support.megatron_mamba import folder_in_mamba_layout, in_te_hybrid_names, put_mamba_together

    ref = in_te_hybrid_names(folder_in_mamba_layout(tmp_path))
    out = tmp_path / "shares"
    out.mkdir()
    spawn(_fill_te_spec, (2, str(tmp_path / "pg"), str(out)), 2)
    whole = put_mamba_together(out)
    assert sorted(whole) == sorted(ref)
    assert [n for n in ref if not same_bytes(whole[n], ref[n])] == []
