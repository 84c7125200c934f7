"""``init_module_`` on a Megatron-Core ``GPTModel`` under Megatron's FSDP2 wrapper
(``TorchFullyShardedDataParallel``, Megatron's ``--use-torch-fsdp2``) (issue 43): each rank fills
its DTensor shards of its tensor-parallel parameters with the bytes of the Hugging Face folder,
without communicating; what is mapped but cannot be verified here (Megatron-FSDP, the Transformer
Engine layer spec) is refused by name before anything is written.

The model is the local layer spec on CPU under gloo (``tests/server/training/test_megatron.py``'s
``megatron_gpt``, with ``transformer_impl="local"`` as Megatron's ``--transformer-impl local`` sets it: the
wrapper then shards each TransformerLayer, the embedding and the root, and no linear inside a
layer twice). The full tensors are gathered by the test (torch's ``DTensor.full_tensor()`` over
the data-parallel group, then the tensor-parallel shares put together by Megatron's rules,
``put_together``) and compared with the folder put into Megatron's layout by the test
(``folder_in_megatrons_layout``), never with ``init_module_``'s own map.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.megatron_models import (HF, MOE, SEED, folder_in_megatrons_layout, fsdp2_wrapped,  # noqa: E402
                                           in_one_process, init_group, megatron_gpt, no_legacy_grouped_mlp,
                                           put_together)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]


def _fill_fsdp2(rank: int, world: int, init_file: str, dp: int, tp: int, pp: int, ep: int, dtype: str, tied: bool,
                out: str) -> None:
    """This rank's FSDP2 shards of a TP=``tp`` x PP=``pp`` model (a stage: its layers; EP=``ep`` > 1:
    the MoE model, this rank's experts) filled three ways (the wrapper with the spec; without one,
    the config derived; the unwrapped model filled, then wrapped), each local shard the same bytes;
    the full tensors gathered over each one's data-parallel group, saved for the test. With EP, the
    wrapper alone (every parameter over the data-parallel group, experts too) is refused first,
    nothing written."""
    from megatron.core import parallel_state as ps
    from torch.distributed.tensor import DTensor

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep)
    spec = {**(MOE if ep > 1 else HF), "tie_word_embeddings": tied}
    built = dict(dtype=dtype, tied=tied, moe=ep > 1, ep=ep, transformer_impl="local")
    if ep > 1:  # the wrapper alone shards the experts over the data-parallel group, across the expert-parallel ranks
        mixed = fsdp2_wrapped(megatron_gpt(tp, pp, **built))
        kept = {n: p.to_local().clone() for n, p in mixed.module.named_parameters()}
        for spec_given in (spec, None):
            with pytest.raises(ValueError, match=r"^module: 'decoder\.layers\.0\.mlp\.experts\.local_experts\.0\."
                                                 r"linear_fc1\.weight' is an expert's weight that FSDP2 shards over ranks "
                                                 r"holding other experts \(expert_model_parallel_size=2; ranks \[\d\] of "
                                                 r"its mesh\): its all-gather joins pieces of different experts.*use "
                                                 r"expert_model_parallel_size=1 under --use-torch-fsdp2, or shard the "
                                                 r"experts over the expert data-parallel group"):
                modelinit.init_module_(mixed, seed=SEED, spec=spec_given)
        assert all(same_bytes(p.to_local(), kept[n]) for n, p in mixed.module.named_parameters())  # nothing written
    model, derived = (fsdp2_wrapped(megatron_gpt(tp, pp, **built), ep > 1) for _ in range(2))
    before = megatron_gpt(tp, pp, **built)
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec=spec)
        own = modelinit.init_module_(derived, seed=SEED)
        modelinit.init_module_(before, seed=SEED, spec=spec)
    before = fsdp2_wrapped(before, ep > 1)  # FSDP2 keeps the values it shards
    params = dict(model.module.named_parameters())
    assert params and all(isinstance(p, DTensor) and p.placements == (torch.distributed.tensor.Shard(0),)
                          for p in params.values())
    assert {p.device_mesh.size() for p in params.values()} == ({dp, dp // ep} if ep > 1 else {dp})  # the experts' apart
    assert summary.elements == sum(p.to_local().numel() for p in params.values()) < summary.global_elements
    assert (summary.missing > 0) == (pp > 1 or ep > 1)  # a stage, an expert-parallel rank: the others'
    assert own.missing == summary.missing and own.derived_config["model_type"] == spec["model_type"]
    for other in (derived, before):
        mine = dict(other.module.named_parameters())
        assert sorted(mine) == sorted(params)
        assert [n for n, p in params.items() if not same_bytes(p.to_local(), mine[n].to_local())] == []
    state = {n: p.full_tensor().detach().clone() for n, p in params.items()}  # the test's gather, after the fill
    first = model.module.decoder.layers[0].layer_number - 1  # a stage's layers, numbered from 0 in its names
    torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(), "first": first,
                "state": state}, f"{out}/rank{rank}.pt")
    exit_rank()


@pytest.mark.parametrize("dp, tp, pp, ep, dtype, tied", [
    (2, 1, 1, 1, "float32", False), (2, 1, 1, 1, "bfloat16", True), (2, 2, 1, 1, "float32", True),
    (2, 2, 1, 1, "bfloat16", False), (3, 1, 1, 1, "float32", False), (2, 1, 2, 1, "float32", False),
    (4, 1, 1, 2, "float32", False)],
    ids=["dp2-float32", "dp2-bfloat16-tied", "dp2xtp2-float32-tied", "dp2xtp2-bfloat16", "dp3-uneven", "dp2xpp2",
         "dp4-ep2-moe"])
def test_fsdp2_shards_put_together_are_the_hugging_face_folder(tmp_path, dp, tp, pp, ep, dtype, tied):
    """DP=2 (2 processes), DP=2 x TP=2 and DP=2 x PP=2 (4 processes: each stage's layers, its
    embedding or its head, sharded over its data-parallel pair) and DP=3 (uneven shards: 64 norm
    elements as 22, 21, 21; 8 q/k norm elements as 3, 3, 2) under Megatron's FSDP2: each rank's
    Shard(0) rows of its tensor-parallel parameter (of [gate_r; up_r], of its query groups, of its
    half of the padded vocabulary) hold the folder's bytes; gathered and put together, every
    tensor is the folder's in Megatron's layout, in float32 and bfloat16 (whose norms Megatron
    keeps in float32), tied and untied; without a spec, and filled before wrapping, the same.
    DP=4 x EP=2 (4 processes, the MoE model): each layer's experts sharded over the expert
    data-parallel pair that holds them, the rest over all four, the same; Megatron's wrapper
    alone, which shards the experts over all four (two ranks' different experts in one
    all-gather), is refused by name with nothing written."""
    refs = {d: folder_in_megatrons_layout(tmp_path, d, tied, moe=ep > 1) for d in sorted({dtype, "float32"})}
    out = tmp_path / "shares"
    out.mkdir()
    world = dp * tp * pp
    spawn(_fill_fsdp2, (world, str(tmp_path / "pg"), dp, tp, pp, ep, dtype, tied, str(out)), world)
    whole = put_together(out, world, ep)
    assert sorted(whole) == sorted(refs["float32"])
    assert {str(ts[0].dtype) for ts in whole.values()} == {f"torch.{d}" for d in refs}
    assert [n for n, ts in whole.items()
            if len(ts) != 1 or not same_bytes(ts[0], refs[str(ts[0].dtype).removeprefix("torch.")][n])] == []


class TELayerNormColumnParallelLinear(torch.nn.Module):
    """A stand-in of Megatron's Transformer Engine wrapper of that name (Transformer Engine cannot
    be installed without CUDA): the check goes by the class's name."""


def _refused(module, match: str) -> None:
    """``init_module_`` refuses ``module`` with ``match``, with a spec and without one (before any
    field is derived)."""
    for spec in (HF, None):
        with pytest.raises(ValueError, match=match):
            modelinit.init_module_(module, seed=SEED, spec=spec)


def _check_refusals() -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard

    model = megatron_gpt()
    model.decoder.layers[0].self_attention.te_qkv = TELayerNormColumnParallelLinear()
    _refused(model, r"^module: 'decoder\.layers\.0\.self_attention\.te_qkv' is Transformer Engine's "
                    r"TELayerNormColumnParallelLinear \(the Transformer Engine layer spec\), which has not been "
                    r"verified on a GPU run yet; build the GPTModel with the local spec: get_gpt_layer_local_spec "
                    r".*use_transformer_engine=False\)$")
    del model.decoder.layers[0].self_attention.te_qkv

    # Megatron-FSDP's classes cannot be built without CUDA: stand-ins of their names and modules, Megatron's
    # adapter (whose name is FSDP1's too) around the megatron_fsdp package's MegatronFSDP, and the latter alone
    inner = type("MegatronFSDP", (torch.nn.Module,), {"__module__": "megatron_fsdp.megatron_fsdp"})()
    inner.module = model
    adapter = type("FullyShardedDataParallel", (torch.nn.Module,),
                   {"__module__": "megatron.core.distributed.fsdp.mcore_fsdp_adapter"})()
    adapter.module = inner
    for wrapper, prefix, cls in ((adapter, r"module\.module\.", "FullyShardedDataParallel"),
                                 (inner, r"module\.", "MegatronFSDP")):
        _refused(wrapper, rf"^module: '{prefix}embedding\.word_embeddings\.weight' is Megatron-FSDP's \({cls}: "
                          r"uneven DTensor pieces of flat buffers\), which cannot be built or verified without a GPU "
                          r"here; use Megatron's --use-torch-fsdp2 \(TorchFullyShardedDataParallel\), or call "
                          r"init_module_ on the GPTModel before wrapping it")
    norm = model.decoder.final_layernorm  # a DTensor parameter that fully_shard did not make: Megatron-FSDP's inside
    mesh = DeviceMesh("cpu", [0])
    norm.weight = torch.nn.Parameter(DTensor.from_local(norm.weight.detach(), mesh, [Shard(0)]))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if n != "decoder.final_layernorm.weight"}
    with pytest.raises(ValueError, match=r"^module: 'decoder\.final_layernorm\.weight' is a DTensor that torch's "
                                         r"fully_shard did not make \(as Megatron-FSDP's uneven pieces of flat buffers\), "
                                         r"which cannot be built or verified without a GPU here"):
        modelinit.init_module_(model, seed=SEED, spec=HF)
    assert all(same_bytes(p.detach(), before[n]) for n, p in model.named_parameters() if n in before)  # nothing written


def test_what_cannot_be_verified_here_is_refused_by_name(tmp_path):
    """The Transformer Engine layer spec (a module of Megatron's TE wrappers: a stand-in of its
    class name) and Megatron-FSDP (its wrapper, a stand-in of its class and module; on the model
    inside it, a DTensor that torch's fully_shard did not make): each one line naming the module
    or parameter and the fix, before anything is written."""
    in_one_process(str(tmp_path / "pg"), _check_refusals)


def _grouped_gpt(experts: int):
    """The MoE test model with ``experts`` GroupedMLP experts (``moe_grouped_gemm``), local implementation."""
    from megatron.core.transformer.moe import grouped_gemm_util

    current, available = torch.cuda.current_device, grouped_gemm_util.assert_grouped_gemm_is_available
    torch.cuda.current_device = lambda: "cpu"  # the router makes its expert-bias buffers on CUDA's current device
    grouped_gemm_util.assert_grouped_gemm_is_available = lambda: None  # building needs no kernel, nor does filling
    try:
        return megatron_gpt(moe=True, moe_grouped_gemm=True, transformer_impl="local", num_moe_experts=experts)
    finally:
        torch.cuda.current_device, grouped_gemm_util.assert_grouped_gemm_is_available = current, available


def _fill_grouped(rank: int, world: int, init_file: str, experts: int) -> None:
    """GroupedMLP under Megatron's FSDP2 wrapper on ``world`` data-parallel ranks, filled: each full
    tensor (gathered by FSDP2's own ``full_tensor()``) is the same model's filled without FSDP2."""
    from megatron.core import parallel_state as ps

    init_group(rank, world, init_file)
    ps.initialize_model_parallel()
    plain, wrapped = _grouped_gpt(experts), fsdp2_wrapped(_grouped_gpt(experts))
    spec = {**MOE, "num_experts": experts}
    assert type(plain.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
    with no_collectives():
        modelinit.init_module_(plain, seed=SEED, spec=spec)
        summary = modelinit.init_module_(wrapped, seed=SEED, spec=spec)
    assert summary.elements == sum(p.to_local().numel() for p in wrapped.module.parameters())
    want = dict(plain.named_parameters())
    got = {n: p.full_tensor() for n, p in wrapped.module.named_parameters()}
    assert {n for n in got if "weight1" in n or "weight2" in n} and sorted(got) == sorted(want)
    assert [n for n, t in got.items() if not same_bytes(t, want[n].detach())] == []
    exit_rank()


@pytest.mark.parametrize("dp, experts", [(2, 4), (4, 2), (3, 8)], ids=["dp2-whole-experts", "dp4-half-experts",
                                                                       "dp3-across-experts"])
def test_grouped_mlp_under_fsdp2_is_the_unsharded_models(tmp_path, dp, experts):
    """GroupedMLP's fused ``weight1`` [hidden, experts x fc1 rows] and ``weight2`` [experts x fc2
    columns, hidden] under Megatron's FSDP2: at DP=2 with 4 experts each rank's ``Shard(0)`` rows
    are two whole experts of the grouped GEMM's view, at DP=4 with 2 experts half of one expert's
    rows; gathered, every tensor is the one the same model holds filled without FSDP2
    (test_megatron_moe.py: the folder's). At DP=3 with 8 experts (``weight1`` [64, 8 x 64] as 22,
    21, 21 rows) a shard starts and ends inside experts: rank 1 holds the end of expert 2, experts
    3 and 4 whole and the start of expert 5, three runs."""
    if why := no_legacy_grouped_mlp():
        pytest.skip(why)
    spawn(_fill_grouped, (dp, str(tmp_path / "pg"), experts), dp)
