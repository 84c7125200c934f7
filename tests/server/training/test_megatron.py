"""``init_module_`` on a Megatron-Core ``GPTModel`` (issue 33, second step): filled in place with the
bytes of the Hugging Face folder ``modelinit init`` writes for the config it corresponds to, at
every tensor- and pipeline-parallel layout, without communicating.

The model is Megatron's local layer spec (no Transformer Engine) built on CPU as Megatron allows
it (``use_cpu_initialization=True``, ``perform_initialization=False``) under gloo. The reference
is the Hugging Face folder put into Megatron's layout by this test's own conversion (q/k/v
concatenated per query group, gate and up stacked into ``linear_fc1``, as Megatron-Bridge does),
with the padded vocabulary's rows taken from the folder of the padded vocabulary. A sharded
layout's full tensors are put together by the test from what each rank holds, by Megatron's rules
(column-parallel rows, row-parallel columns, SwiGLU's [gate_r; up_r], a stage's layers from its
first layer's number), not by ``init_module_``'s own map. (Megatron's distributed checkpoint would
do it, but its writer waits for CUDA.)
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.megatron_models import (HF, MOE, SEED, STARCODER2, chunks_hold_each_tensor_once,  # noqa: E402
                                           in_te_spec_names,
                                           folder_in_megatrons_layout, in_one_process, init_group, megatron_gpt,
                                           put_together)

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),  # Megatron warns that Apex/TE are absent
              pytest.mark.slow]


def _check_one_device(ref_paths: dict, dtype: str, tied: bool, policy, moe: bool) -> None:
    refs = {d: torch.load(p) for d, p in ref_paths.items()}
    ref = refs[dtype]
    model = megatron_gpt(dtype=dtype, tied=tied, moe=moe)
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec={**(MOE if moe else HF), "tie_word_embeddings": tied},
                                         policy=policy)
    got = {n: p.detach() for n, p in model.named_parameters()}
    assert sorted(got) == sorted(ref)
    # Megatron keeps its norms in float32 under params_dtype=bfloat16: each tensor has its own dtype's bytes
    bad = [n for n in ref if not same_bytes(got[n], refs[str(got[n].dtype).removeprefix("torch.")][n])]
    assert bad == []
    assert any(p.dtype == torch.float32 for p in got.values())
    assert summary.dtypes == tuple(sorted({dtype, "float32"}))
    assert summary.architecture == ("Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM") and summary.missing == 0
    assert summary.elements == summary.global_elements == sum(p.numel() for p in got.values())


@pytest.mark.parametrize("dtype, tied, policy, moe", [("float32", False, None, False), ("bfloat16", False, None, False),
                                                      ("float32", True, None, False), ("float32", False, "megatron", False),
                                                      ("bfloat16", False, None, True)],
                         ids=["float32", "bfloat16", "tied", "megatron-policy", "moe-bfloat16"])
def test_one_device_equals_the_hugging_face_folder_in_megatrons_layout(tmp_path, dtype, tied, policy, moe):
    """TP=1, PP=1: every parameter, the padded vocabulary's rows included, is the folder's bytes in
    Megatron's layout; a tied model shares the embedding (no output layer of its own); an MoE
    model's experts (SequentialMLP) and router are the Qwen3 MoE folder's."""
    ref_paths = {}
    for d in sorted({dtype, "float32"}):
        ref_paths[d] = str(tmp_path / f"ref-{d}.pt")
        torch.save(folder_in_megatrons_layout(tmp_path, d, tied, policy, moe), ref_paths[d])
    in_one_process(str(tmp_path / "pg"), _check_one_device, ref_paths, dtype, tied, policy, moe)


def _fill_layout(rank: int, world: int, init_file: str, tp: int, pp: int, ep: int, tied: bool, out: str,
                 ref_path: str, layernorm: bool = False) -> None:
    """This rank's share of a (tp, pp, ep) model, filled, saved as it holds it (with its place) for the
    test to put together."""
    from megatron.core import parallel_state as ps

    init_group(rank, world, init_file)
    experts_tp = 1 if ep > 1 else tp  # MoE parallel folding: the experts' TP apart from the attention's
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 expert_model_parallel_size=ep, expert_tensor_parallel_size=experts_tp)
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # a tied model's last stage moves its copy to CUDA to all-reduce it
    try:
        model = megatron_gpt(tp, pp, tied=tied, moe=ep > 1, ep=ep, layernorm=layernorm,
                             expert_tensor_parallel_size=experts_tp)
    finally:
        torch.Tensor.cuda = cuda
    hf = MOE if ep > 1 else STARCODER2 if layernorm else HF
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec={**hf, "tie_word_embeddings": tied})
    assert summary.elements == sum(p.numel() for p in model.parameters())
    assert summary.elements < summary.global_elements if tp > 1 else summary.elements == summary.global_elements
    assert (summary.missing > 0) == (pp > 1 or ep > 1), summary  # a stage, an expert-parallel rank: the others' tensors
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
                "first": [layer.layer_number - 1 for layer in model.decoder.layers][0], "state": state},
               f"{out}/rank{rank}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("tp, pp, ep, tied, layernorm", [(2, 1, 1, False, False), (1, 2, 1, False, False),
                                                         (1, 2, 1, True, False), (2, 1, 2, False, False),
                                                         (2, 2, 1, True, False), (2, 1, 1, False, True)],
                         ids=["tp2", "pp2", "pp2-tied", "tp2-ep2-moe", "tp2-pp2-tied", "tp2-layernorm-gelu-biases"])
def test_parallel_layouts_equal_one_device(tmp_path, tp, pp, ep, tied, layernorm):
    """TP=2 (each rank's query groups, [gate_r; up_r], half the padded vocabulary, half of
    linear_proj's and linear_fc2's columns), PP=2 (each stage its layers, numbered from 0; a tied
    model's last stage its own copy of the embedding), EP=2 beside TP=2 on the same 2 ranks (MoE parallel
    folding, the experts' TP 1: each rank 2 of the 4 experts whole, numbered from 0; the rest TP-split),
    TP=2 x PP=2 over 4 ranks, and a Starcoder2-style model at TP=2 (LayerNorm's and the
    linears' biases, a GELU MLP: column-parallel biases split, row-parallel ones whole): each rank fills its own share, and the shares put together are the one-device model's bytes."""
    ref = folder_in_megatrons_layout(tmp_path, tied=tied, moe=ep > 1, layernorm=layernorm)
    ref_path, out = str(tmp_path / "ref.pt"), tmp_path / "shares"
    out.mkdir()
    torch.save(ref, ref_path)
    world = max(tp * pp, ep)
    spawn(_fill_layout, (world, str(tmp_path / "pg"), tp, pp, ep, tied, str(out), ref_path, layernorm), world)
    whole = put_together(out, world, ep, gated=not layernorm)
    if tied:  # the last stage's copy of the embedding is the embedding
        assert [same_bytes(t, ref["embedding.word_embeddings.weight"]) for t in whole.pop("output_layer.weight")] == [True]
    assert sorted(whole) == sorted(ref)
    assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []


def _fill_te_spec(rank: int, world: int, init_file: str, out: str) -> None:
    """This rank's share of the Qwen3-style model built with Megatron's Transformer Engine layer spec
    (over tests/support/megatron_te.py's stand-in of Transformer Engine's modules) at TP=``world``:
    refused while ``TE_LAYER_SPEC_VERIFIED`` is off, nothing written; with it on, filled with the spec,
    and a second model without it (Qwen3 derived, the same bytes); and the Qwen3-MoE-style one of the
    same spec with TEGroupedMLP experts and the Starcoder2-style one, each filled with its spec; saved for
    the test to put together."""
    from megatron.core import parallel_state as ps

    from modelinit_server.training.megatron import refusals
    from tests.support.megatron_te import as_sequential_experts, transformer_engine_stand_in

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    with transformer_engine_stand_in():
        model, derived = (megatron_gpt(world, te_spec=True) for _ in range(2))
        moe = megatron_gpt(world, moe=True, te_spec=True, moe_grouped_gemm=True)
        starcoder2 = megatron_gpt(world, layernorm=True, te_spec=True)
    attention = model.decoder.layers[0].self_attention
    assert (type(attention.linear_qkv).__name__, type(attention.linear_proj).__name__) == (
        "TELayerNormColumnParallelLinear", "TERowParallelLinear")
    before = [p.detach().clone() for p in model.parameters()]
    with no_collectives(), pytest.raises(ValueError, match=r"^module: 'decoder\.layers\.0\.self_attention\.\w+' is "
                                                         r"Transformer Engine's TE\w+ \(the Transformer Engine layer spec\)"):
        modelinit.init_module_(model, seed=SEED, spec=HF)
    assert all(same_bytes(a, b.detach()) for a, b in zip(before, model.parameters()))  # nothing written
    refusals.TE_LAYER_SPEC_VERIFIED = True
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec=HF)
        own = modelinit.init_module_(derived, seed=SEED)
    assert own.derived_config["model_type"] == "qwen3"
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert summary.elements == sum(t.numel() for t in state.values()) < summary.global_elements
    assert [n for n, p in derived.named_parameters() if not same_bytes(p.detach(), state[n])] == []
    refusals.TE_GROUPED_EXPERTS_VERIFIED = True
    assert type(moe.decoder.layers[0].mlp.experts).__name__ == "TEGroupedMLP"
    with no_collectives():
        modelinit.init_module_(moe, seed=SEED, spec=MOE)
        modelinit.init_module_(starcoder2, seed=SEED, spec=STARCODER2)
    for name, filled in (("dense", model), ("moe", moe), ("starcoder2", starcoder2)):
        os.makedirs(f"{out}/{name}", exist_ok=True)
        torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": 0, "first": 0, "state": as_sequential_experts(
            {n: p.detach().clone() for n, p in filled.named_parameters()})}, f"{out}/{name}/rank{rank}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_the_transformer_engine_layer_spec_at_tp2_is_the_folder(tmp_path):
    """The Transformer Engine layer spec (``get_gpt_layer_with_transformer_engine_spec``: each layer's
    input norm fused into ``linear_qkv`` and its pre-MLP norm into ``linear_fc1`` as
    ``layer_norm_weight``, the q/k norms Transformer Engine's RMSNorm), Megatron's own modules over a
    stand-in of Transformer Engine's (which cannot be installed without CUDA), at TP=2: each rank
    fills its share; put together, every tensor is the folder's (the norms under their fused names).
    The same of a Qwen3-MoE-style model of that spec with TEGroupedMLP experts (its MoE layers' pre-MLP
    norm apart; each expert split by TP), and of a Starcoder2-style one (LayerNorm's ``layer_norm_bias``,
    every linear's bias: column-parallel ones split, row-parallel ones whole). Refused until a GPU run has verified the real layers, nothing
    written."""
    out = tmp_path / "shares"
    spawn(_fill_te_spec, (2, str(tmp_path / "pg"), str(out)), 2)
    for name, moe, layernorm in (("dense", False, False), ("moe", True, False), ("starcoder2", False, True)):
        ref = in_te_spec_names(folder_in_megatrons_layout(tmp_path, moe=moe, layernorm=layernorm), moe=moe)
        whole = put_together(out / name, 2, 1, gated=not layernorm)
        assert sorted(whole) == sorted(ref), name
        assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []


def _fill_chunks(rank: int, world: int, init_file: str, vp: int, out: str) -> None:
    """This rank's ``vp`` model chunks of a PP=``world`` interleaved pipeline, each a GPTModel with
    its ``vp_stage``: each filled by its own call with the spec, and again all in one call without
    it (the rank's list of chunks, as Megatron's ``get_model`` returns it; the config derived from
    a chunk is the whole model's); saved with the layers Megatron numbers it (its offset)."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(pipeline_model_parallel_size=world, virtual_pipeline_model_parallel_size=vp)
    over = dict(virtual_pipeline_model_parallel_size=vp)
    chunks = [megatron_gpt(pp=world, vp_stage=stage, **over) for stage in range(vp)]
    with no_collectives():
        together = modelinit.init_module_(chunks, seed=SEED)
    assert len(together.parts) == vp and together.elements == sum(s.elements for s in together.parts)
    for stage in range(vp):
        model, derived, own = megatron_gpt(pp=world, vp_stage=stage, **over), chunks[stage], together.parts[stage]
        with no_collectives():
            summary = modelinit.init_module_(model, seed=SEED, spec=HF)
        assert own.derived_config["num_hidden_layers"] == HF["num_hidden_layers"], own.derived_config
        assert own.derived_config["model_type"] == "qwen3" and own.missing == summary.missing > 0
        got, again = dict(derived.named_parameters()), dict(model.named_parameters())
        assert sorted(got) == sorted(again) and all(same_bytes(got[n], again[n]) for n in got)
        first = [layer.layer_number - 1 for layer in model.decoder.layers]
        assert first == [get_transformer_layer_offset(model.config, vp_stage=stage) + i for i in range(len(first))]
        torch.save({"first": first[0], "state": {n: p.detach().clone() for n, p in model.named_parameters()}},
                   f"{out}/rank{rank}-chunk{stage}.pt")
    exit_rank()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_virtual_pipeline_chunks_hold_the_folder_each_tensor_once(tmp_path):
    """PP=2 x VP=2 (interleaved 1F1B): each rank builds 2 model chunks (GPTModel with ``vp_stage``,
    one layer each: rank 0 holds layers 0 and 2, rank 1 layers 1 and 3, by Megatron's
    ``get_transformer_layer_offset``), each filled by its own ``init_module_`` call (and, without
    a spec, the rank's chunks in one call). Over all
    ranks' chunks every stored tensor is in exactly one chunk (the embedding in rank 0's first,
    the final norm and output layer in rank 1's last), with the folder's bytes; without a spec
    each chunk derives the whole model's config (4 layers) and the same bytes."""
    ref, out = folder_in_megatrons_layout(tmp_path), tmp_path / "chunks"
    out.mkdir()
    spawn(_fill_chunks, (2, str(tmp_path / "pg"), 2, str(out)), 2)
    holder = chunks_hold_each_tensor_once(out, ref)
    assert holder["embedding.word_embeddings.weight"] == "rank0-chunk0"
    assert holder["output_layer.weight"] == "rank1-chunk1"
    assert holder["decoder.layers.2.input_layernorm.weight"] == "rank0-chunk1"


def _check_qkv_rows() -> None:
    from modelinit_server.training.megatron import qkv_rows

    for groups in (2, 8, 1):  # grouped-query, multi-head, multi-query attention
        model = megatron_gpt(num_query_groups=groups, qk_layernorm=False)  # no norm between the rows and the output
        attention = model.decoder.layers[0].self_attention
        weight = attention.linear_qkv.weight
        with torch.no_grad():  # row r maps the first input feature to r: the output says which row each value came from
            weight.zero_()
            weight[:, 0] = torch.arange(weight.shape[0], dtype=weight.dtype)
        hidden = torch.zeros(1, 1, HF["hidden_size"])
        hidden[..., 0] = 1
        with torch.no_grad():
            q, k, v = attention.get_query_key_value_tensors(hidden)[:3]
        for got, want in zip((q, k, v), qkv_rows(8, groups, 8)):  # [sq, b, heads, head_dim]: Hugging Face's row order
            assert got.reshape(-1).to(torch.int64).tolist() == want.tolist(), groups


def test_qkv_rows_are_megatrons_own_split(tmp_path):
    """:func:`qkv_rows` against Megatron's own ``get_query_key_value_tensors`` on a probe weight,
    for grouped-query, multi-head and multi-query attention."""
    in_one_process(str(tmp_path / "pg"), _check_qkv_rows)


def _check_refusals() -> None:
    model = megatron_gpt()
    model.config.window_size = (64, 0)  # without a spec, a field no Hugging Face config derived has is refused by name
    with pytest.raises(ValueError, match=r"^spec: the Megatron model's window_size=\(64, 0\) \(sliding-window attention\) "
                                         r"has no counterpart .*: init_module_\(model, spec="):
        modelinit.init_module_(model, seed=SEED)
    model.config.window_size = None
    cases = [
        ({**HF, "intermediate_size": 128}, r"^module: Megatron's 'decoder\.layers\.0\.mlp\.linear_fc1\.weight' holds "
         r"'model\.layers\.0\.mlp\.gate_proj\.weight' as \[96, 64\], the spec has \[128, 64\]: the model does not match"),
        ({**HF, "tie_word_embeddings": True}, r"^module: Megatron's 'output_layer\.weight' holds 'lm_head\.weight', which the "
         r"spec \(Qwen3ForCausalLM\) does not have: .*tie_word_embeddings"),
        ({**HF, "num_hidden_layers": 3}, r"^module: the Megatron model has 4 layers \(num_layers\), the spec "
         r"\(Qwen3ForCausalLM\) has 3"),
        ({**HF, "vocab_size": 2048}, r"'embedding\.word_embeddings\.weight' holds 'model\.embed_tokens\.weight' as "
         r"\[1024, 64\], the spec has \[2048, 64\]"),
        ({**HF, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}, r"holds 'model\.layers\.0\.self_attn\.q_norm"
         r"\.weight', which the spec \(LlamaForCausalLM\) does not have: give the Hugging Face config this model "
         r"corresponds to \(spec=\.\.\.\), of a family that has it \(q/k norms: qwen3; q/k/v biases: qwen2\); the spec "
         r"differs from the model's own config in model_type: 'llama' in the spec, 'qwen3' in the model"),
    ]
    for spec, message in cases:
        with pytest.raises(ValueError, match=message) as refused:
            modelinit.init_module_(model, seed=SEED, spec=spec)
        if "q_norm" in message:  # not the unrelated tying hint it once ended with
            assert "tie_word_embeddings" not in str(refused.value)
    model.config.rotary_interleaved = True
    with pytest.raises(ValueError, match=r"^module: a Megatron model with interleaved RoPE \(rotary_interleaved\) is not "
                                         r"supported yet"):
        modelinit.init_module_(model, seed=SEED, spec=HF)
    model.config.rotary_interleaved = False
    model.mtp_process = True  # a multi-token prediction block: the folder has no tensors of it
    with pytest.raises(ValueError, match=r"^module: the Megatron model has a multi-token prediction block .*build the "
                                         r"GPTModel without mtp_block_spec"):
        modelinit.init_module_(model, seed=SEED, spec=HF)
    model.mtp_process = False
    model.te_linear = type("TELayerNormColumnParallelLinear", (torch.nn.Module,), {})()  # a Transformer Engine class name
    with pytest.raises(ValueError, match=r"^module: 'te_linear' is Transformer Engine's TELayerNormColumnParallelLinear "
                                         r"\(the Transformer Engine layer spec\), which has not been verified on a GPU run "
                                         r"yet; build the GPTModel with the local spec: get_gpt_layer_local_spec "
                                         r"\(SequentialMLP experts, or megatron-core 0.16's GroupedMLP\)"):
        modelinit.init_module_(model, seed=SEED, spec=HF)
    del model.te_linear
    model.te_experts = type("TEGroupedMLP", (torch.nn.Module,), {})()  # Transformer Engine's grouped experts' class name
    with pytest.raises(ValueError, match=r"^module: 'te_experts' is Transformer Engine's TEGroupedMLP \(grouped experts, "
                                         r"moe_grouped_gemm with the Transformer Engine spec\), which has not been "
                                         r"verified on a GPU run yet; build the experts as SequentialMLP"):
        modelinit.init_module_(model, seed=SEED, spec=HF)


def test_a_model_that_does_not_match_its_spec_is_refused_by_name(tmp_path):
    """No spec where the config cannot be derived, a spec that differs in a size, in tying, in depth, in vocabulary, in its tensors
    (q/k norms), a layout not mapped yet (interleaved RoPE, Transformer Engine's grouped experts, a multi-token
    prediction block): each one line
    naming the tensor and what was expected."""
    in_one_process(str(tmp_path / "pg"), _check_refusals)


def _check_megatron_preset() -> None:
    from scipy import stats

    torch.manual_seed(0)
    own = megatron_gpt(perform_initialization=True)  # Megatron's own CPU init: init_method_normal, scaled_init_method_normal
    ours = megatron_gpt()
    modelinit.init_module_(ours, seed=SEED, spec=HF, policy="megatron")
    mine = dict(ours.named_parameters())
    for name, p in own.named_parameters():
        a, b = p.detach().reshape(-1).double(), mine[name].detach().reshape(-1).double()
        if torch.all(a == a[0]):  # norms: Megatron's ones, element for element
            assert torch.equal(a, b), name
            continue
        # the same law: two samples of n elements each; a KS test at p > 1e-6, and the stds within
        # 6 standard errors of their ratio (the sample std's relative error is about 1/sqrt(2n) each)
        n = a.numel()
        assert stats.ks_2samp(a.numpy(), b.numpy()).pvalue > 1e-6, name
        assert abs(float(a.std() / b.std()) - 1) < 6 / n ** 0.5, (name, float(a.std()), float(b.std()))
        assert abs(float(a.mean()) - float(b.mean())) < 6 * float(a.std()) * (2 / n) ** 0.5, name


def test_the_megatron_preset_is_megatrons_own_init(tmp_path):
    """The ``megatron`` policy draws what Megatron-Core's own init draws on its own modules: N(0,
    0.02) for the embedding, QKV, fc1 and output layer, N(0, 0.02/sqrt(2L)) for linear_proj and
    linear_fc2, norms 1 (its CPU init, ``perform_initialization=True``)."""
    in_one_process(str(tmp_path / "pg"), _check_megatron_preset)
