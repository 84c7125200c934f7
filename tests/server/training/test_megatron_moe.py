"""``init_module_`` on Megatron-Core MoE models beyond routed experts (issue 43): shared experts
(Qwen2-MoE's ``shared_expert`` with its sigmoid gate; DeepSeek's and GLM-4-MoE's
``shared_experts``) and the router's expert bias (``moe_router_enable_expert_bias``: Hugging
Face's ``mlp.gate.e_score_correction_bias``), at TP=2, each byte-equal to the Hugging Face folder
of the same config put into Megatron's layout by this test's own conversion.

Two ranks (gloo) each fill their share of two tiny models: a Qwen2-MoE-style one without a spec
(the config derived, ``training/megatron/config.py``) in bfloat16, and a GLM-4-MoE-style one
(shared experts without a gate, the expert bias, sigmoid routing) with its config given, in
float32, and again without it (``glm4_moe`` derived: the same bytes); and a Qwen3-MoE-style one with
megatron-core 0.16's GroupedMLP experts (built on CPU with the check for the grouped_gemm CUDA library
bypassed: filling runs no kernel) and with Transformer Engine's TEGroupedMLP experts (the only grouped
experts 0.17 and later have; built over a stand-in of Transformer Engine's GroupedLinear,
tests/support/megatron_te.py), the latter at TP=2 and at EP=2 beside TP=2. The shares are put together
by Megatron's rules (tests/support/megatron_models.put_together)."""
from __future__ import annotations

import os
import re
import pathlib

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.megatron_models import (HF, MOE, PADDED, SEED, files_of, folder_in_megatrons_layout,  # noqa: E402
                                           init_group, megatron_gpt, no_legacy_grouped_mlp, put_together)
from tests.support.megatron_rules import gated_mlp, qkv_per_group  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),  # Megatron warns that Apex/TE are absent
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]

#: Qwen2-MoE-style: q/k/v biases, no q/k norms, 4 routed experts (32 wide, top 2) and a shared expert
#: 48 wide behind its sigmoid gate (Megatron: moe_shared_expert_gate).
QWEN2_MOE_FIELDS = dict(qk_layernorm=False, add_qkv_bias=True, moe_shared_expert_intermediate_size=48, layernorm_epsilon=1e-6,
                        moe_shared_expert_gate=True)
QWEN2_MOE = {**MOE, "model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": PADDED,
             "shared_expert_intermediate_size": 48, "qkv_bias": True}
#: GLM-4-MoE-style (DeepSeek-V3's MoE over grouped-query attention): one shared expert without a
#: gate, sigmoid routing with an expert bias.
GLM4_MOE_FIELDS = dict(qk_layernorm=False, moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
                       moe_router_enable_expert_bias=True)
GLM4_MOE = {"model_type": "glm4_moe", "architectures": ["Glm4MoeForCausalLM"], "hidden_size": 64, "head_dim": 8,
            "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 96,
            "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1, "use_qk_norm": False, "attention_bias": False,
            "vocab_size": PADDED, "max_position_embeddings": 128, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}


def _in_megatrons_layout(files: dict, shared: str, shared_gate: str | None) -> dict:
    """A MoE folder's tensors under a one-process Megatron model's names: q, k, v (and their biases)
    concatenated per query group, [gate; up] for every expert and the shared expert."""
    groups, head_dim, layers = HF["num_key_value_heads"], HF["head_dim"], HF["num_hidden_layers"]
    ref = {"embedding.word_embeddings.weight": files["model.embed_tokens.weight"],
           "output_layer.weight": files["lm_head.weight"], "decoder.final_layernorm.weight": files["model.norm.weight"]}
    for i in range(layers):
        hf, mine = f"model.layers.{i}.", f"decoder.layers.{i}."
        for leaf in ("weight", "bias"):
            if f"{hf}self_attn.q_proj.{leaf}" in files:
                ref[mine + f"self_attention.linear_qkv.{leaf}"] = qkv_per_group(
                    *(files[f"{hf}self_attn.{p}_proj.{leaf}"] for p in "qkv"), groups, head_dim)
        ref[mine + "self_attention.linear_proj.weight"] = files[f"{hf}self_attn.o_proj.weight"]
        ref[mine + "input_layernorm.weight"] = files[f"{hf}input_layernorm.weight"]
        ref[mine + "pre_mlp_layernorm.weight"] = files[f"{hf}post_attention_layernorm.weight"]
        ref[mine + "mlp.router.weight"] = files[f"{hf}mlp.gate.weight"]
        if f"{hf}mlp.gate.e_score_correction_bias" in files:
            ref[mine + "mlp.router.expert_bias"] = files[f"{hf}mlp.gate.e_score_correction_bias"]
        mlps = {f"mlp.experts.local_experts.{e}.": f"{hf}mlp.experts.{e}." for e in range(4)}
        mlps["mlp.shared_experts."] = f"{hf}{shared}"
        for theirs_mine, theirs in mlps.items():
            ref.update({mine + theirs_mine + k: t for k, t in gated_mlp(files, theirs).items()})
        if shared_gate:
            ref[mine + "mlp.shared_experts.gate_weight"] = files[f"{hf}{shared_gate}"]
    return ref


def _fill_shares(rank: int, world: int, init_file: str, out: str) -> None:
    from megatron.core import parallel_state as ps

    init_group(rank, world, init_file)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # the router makes its expert-bias buffers on CUDA's current device
    try:
        qwen2 = megatron_gpt(world, dtype="bfloat16", moe=True, **QWEN2_MOE_FIELDS)
        glm4 = megatron_gpt(world, moe=True, **GLM4_MOE_FIELDS)
        glm4_own = megatron_gpt(world, moe=True, **GLM4_MOE_FIELDS)
    finally:
        torch.cuda.current_device = current
    with no_collectives():
        derived = modelinit.init_module_(qwen2, seed=SEED)  # no spec: Qwen2-MoE, derived
        given = modelinit.init_module_(glm4, seed=SEED, spec=GLM4_MOE)
        own = modelinit.init_module_(glm4_own, seed=SEED)  # no spec: GLM-4-MoE, derived (DeepSeek's routing)
    if not no_legacy_grouped_mlp():
        _fill_grouped(world, rank, out)
    assert derived.derived_config["model_type"] == "qwen2_moe" and given.derived_config is None
    differ = {k: (v, own.derived_config.get(k)) for k, v in GLM4_MOE.items() if own.derived_config.get(k) != v}
    assert differ == {}, differ
    assert own.derived_config["partial_rotary_factor"] == 1.0 and own.derived_config["routed_scaling_factor"] == 1.0
    mine = dict(glm4.named_parameters())
    assert [n for n, t in glm4_own.named_parameters() if not same_bytes(t, mine[n])] == []
    assert given.dtypes == ("float32",) and derived.dtypes == ("bfloat16", "float32")  # norms stay float32
    tp = ps.get_tensor_model_parallel_rank()
    for name, model, summary in (("qwen2", qwen2, derived), ("glm4", glm4, given)):
        assert summary.missing == 0 and summary.elements < summary.global_elements
        state = {n: t.detach().clone() for n, t in model.state_dict().items() if t is not None and t.is_floating_point()
                 and not n.endswith("_extra_state")}
        assert summary.elements == sum(t.numel() for t in state.values())
        os.makedirs(f"{out}/{name}", exist_ok=True)
        torch.save({"tp": tp, "ep": 0, "first": 0, "state": state, "derived": summary.derived_config},
                   f"{out}/{name}/rank{rank}.pt")
    _fill_te_grouped(world, rank, out)  # last: it sets the parallel state up again, for EP too
    exit_rank()


def _fill_grouped(world: int, rank: int, out: str) -> None:
    """Megatron-Core 0.16's GroupedMLP (local, grouped GEMM) filled without a spec, its experts saved as
    SequentialMLP's would be."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe import grouped_gemm_util

    current, available = torch.cuda.current_device, grouped_gemm_util.assert_grouped_gemm_is_available
    torch.cuda.current_device = lambda: "cpu"
    grouped_gemm_util.assert_grouped_gemm_is_available = lambda: None  # building needs no kernel, nor does filling
    try:
        grouped = megatron_gpt(world, moe=True, moe_grouped_gemm=True)
    finally:
        torch.cuda.current_device, grouped_gemm_util.assert_grouped_gemm_is_available = current, available
    assert type(grouped.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
    with no_collectives():
        in_groups = modelinit.init_module_(grouped, seed=SEED)  # no spec: Qwen3-MoE, derived
    assert in_groups.derived_config["model_type"] == "qwen3_moe"
    # GroupedMLP's weights as SequentialMLP's experts, by Megatron's own rule (its grouped GEMM's view, its
    # sharded_state_dict's transpose): weight1 viewed [E, hidden, rows] -> expert e's linear_fc1 [rows, hidden];
    # weight2 viewed [E, columns, hidden] -> expert e's linear_fc2 [hidden, columns]
    state = {}
    for n, t in grouped.state_dict().items():
        if t is None or not t.is_floating_point() or n.endswith("_extra_state"):
            continue
        head, _, leaf = n.rpartition(".experts.")
        if leaf in ("weight1", "weight2"):
            e = grouped.config.num_moe_experts
            hidden = grouped.config.hidden_size
            per = (t.detach().view(e, hidden, -1) if leaf == "weight1" else t.detach().view(e, -1, hidden)).transpose(-1, -2)
            fc = "linear_fc1" if leaf == "weight1" else "linear_fc2"
            state.update({f"{head}.experts.local_experts.{i}.{fc}.weight": per[i].clone() for i in range(e)})
        else:
            state[n] = t.detach().clone()
    os.makedirs(f"{out}/grouped", exist_ok=True)
    torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": 0, "first": 0, "state": state,
                "derived": in_groups.derived_config}, f"{out}/grouped/rank{rank}.pt")
    assert in_groups.elements == sum(t.numel() for t in state.values()) < in_groups.global_elements


def _fill_te_grouped(world: int, rank: int, out: str) -> None:
    """Megatron's TEGroupedMLP experts (Transformer Engine's grouped GEMM; tests/support/megatron_te.py
    builds them over a stand-in of its GroupedLinear) in a Qwen3-MoE-style model: refused while
    ``TE_GROUPED_EXPERTS_VERIFIED`` is off and when the experts' weights are packed into one parameter,
    nothing written; with the switch on, filled without a spec at TP=2 (the experts split by TP too) and
    again at EP=2 beside TP=2 (the experts' TP 1), each rank's share saved under SequentialMLP's names."""
    from megatron.core import parallel_state as ps

    from modelinit_server.training.megatron import refusals
    from tests.support.megatron_te import as_sequential_experts, transformer_engine_stand_in

    for name, experts_tp, ep in (("te-tp2", world, 1), ("te-ep2", 1, world)):
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=world, expert_model_parallel_size=ep,
                                     expert_tensor_parallel_size=experts_tp)
        with transformer_engine_stand_in():
            model = megatron_gpt(world, moe=True, ep=ep, te_experts=True, expert_tensor_parallel_size=experts_tp,
                                 moe_grouped_gemm=True)
        experts = model.decoder.layers[0].mlp.experts
        assert type(experts).__name__ == "TEGroupedMLP" and experts.num_local_experts == 4 // ep
        if name == "te-tp2":
            before = [p.detach().clone() for p in model.parameters()]
            fc1 = experts.linear_fc1
            for verified, packed, message in (
                    (False, False, "'decoder.layers.0.mlp.experts' is Transformer Engine's TEGroupedMLP (grouped experts"),
                    (True, True, "'decoder.layers.0.mlp.experts.linear_fc1' (TEColumnParallelGroupedLinear) packs")):
                refusals.TE_GROUPED_EXPERTS_VERIFIED, fc1.single_grouped_weight = verified, packed
                with no_collectives(), pytest.raises(ValueError, match=re.escape(message)):
                    modelinit.init_module_(model, seed=SEED)
            fc1.single_grouped_weight = False
            assert all(same_bytes(a, b.detach()) for a, b in zip(before, model.parameters()))  # nothing written
            # a module of Transformer Engine's own inside the grouped linear is part of it, not the layer spec
            fc1.store = type("WeightGradStore", (torch.nn.Module,), {"__module__": "transformer_engine.pytorch.module"})()
        refusals.TE_GROUPED_EXPERTS_VERIFIED = True
        with no_collectives():
            summary = modelinit.init_module_(model, seed=SEED)  # no spec: Qwen3-MoE, derived
        assert summary.derived_config["model_type"] == "qwen3_moe"
        state = as_sequential_experts({n: p.detach().clone() for n, p in model.named_parameters()})
        assert summary.elements == sum(t.numel() for t in state.values())
        os.makedirs(f"{out}/{name}", exist_ok=True)
        torch.save({"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(), "first": 0,
                    "state": state}, f"{out}/{name}/rank{rank}.pt")
    refusals.TE_GROUPED_EXPERTS_VERIFIED = False


@pytest.fixture(scope="module")
def shares(tmp_path_factory) -> pathlib.Path:
    """Every rank's share of the TP=2 models (one world of two ranks for the module's tests)."""
    tmp = tmp_path_factory.mktemp("moe-tp2")
    spawn(_fill_shares, (2, str(tmp / "pg"), str(tmp / "shares")), 2)
    return tmp / "shares"


@pytest.mark.xdist_group("megatron-moe-tp2")  # one world of ranks for both (the shares fixture)
def test_shared_experts_and_the_expert_bias_at_tp2_are_the_folders(tmp_path, shares):
    """At TP=2 each rank fills its half of the shared expert (column-parallel [gate_r; up_r],
    row-parallel down), the shared expert's gate and the router and its expert bias whole; put
    together, every tensor is the folder's: Qwen2-MoE's ``mlp.shared_expert.*`` and
    ``mlp.shared_expert_gate`` (config derived, bfloat16, float32 norms), GLM-4-MoE's
    ``mlp.shared_experts.*`` and ``mlp.gate.e_score_correction_bias`` (float32)."""
    out = shares
    derived = torch.load(out / "qwen2" / "rank0.pt")["derived"]
    assert {k: derived[k] for k in QWEN2_MOE if k in derived} == {k: v for k, v in QWEN2_MOE.items() if k in derived}
    for name, config, dtypes, shared, gate in (
            ("qwen2", derived, ("bfloat16", "float32"), "mlp.shared_expert.", "mlp.shared_expert_gate.weight"),
            ("glm4", GLM4_MOE, ("float32",), "mlp.shared_experts.", None)):
        refs = {}
        with modelinit.Client() as c:
            for dtype in dtypes:
                c.init_model(config, seed=SEED, out_dir=tmp_path / f"{name}-{dtype}", dtype=dtype)
                refs[dtype] = _in_megatrons_layout(files_of(tmp_path / f"{name}-{dtype}"), shared, gate)
        whole = put_together(pathlib.Path(out / name), 2, 1)
        assert sorted(whole) == sorted(refs[dtypes[0]]), name
        bad = [n for n, ts in whole.items()
               if len(ts) != 1 or not same_bytes(ts[0], refs[str(ts[0].dtype).removeprefix("torch.")][n])]
        assert bad == [], name
    assert torch.equal(whole["decoder.layers.0.mlp.router.expert_bias"][0], torch.zeros(4))  # hf-default: zeros


@pytest.mark.xdist_group("megatron-moe-tp2")  # one world of ranks for both (the shares fixture)
def test_grouped_experts_at_tp2_are_the_folder(tmp_path, shares):
    """A GroupedMLP model (Megatron-Core 0.16's grouped-GEMM experts: one ``weight1``/``weight2`` per
    layer, each expert's tensor transposed in it; config derived: Qwen3-MoE of the padded vocabulary):
    its experts, read out by Megatron's own view and transpose, are the Qwen3-MoE folder's (the
    tokenizer's vocabulary, the padded rows from the padded folder: SequentialMLP's test's reference)."""
    if why := no_legacy_grouped_mlp():
        pytest.skip(why)
    out = shares
    ref = folder_in_megatrons_layout(tmp_path, moe=True)
    whole = put_together(pathlib.Path(out / "grouped"), 2, 1)
    assert sorted(whole) == sorted(ref)
    assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []


@pytest.mark.xdist_group("megatron-moe-tp2")  # one world of ranks for both (the shares fixture)
@pytest.mark.parametrize("layout, ep", [("te-tp2", 1), ("te-ep2", 2)])
def test_transformer_engine_grouped_experts_are_the_folder(tmp_path, shares, layout, ep):
    """Megatron's TEGroupedMLP (Transformer Engine's grouped GEMM experts, the only grouped experts
    Megatron-Core 0.17 and later have: one ``weight{i}`` per local expert), built over a stand-in of
    Transformer Engine's GroupedLinear, filled without a spec (Qwen3-MoE derived) at TP=2 (each
    expert's [gate_r; up_r] rows and half of its down columns) and at EP=2 beside TP=2 (each rank 2 of
    the 4 experts whole): put together, every tensor is the folder's. Refused while not verified on a
    GPU run, and when its weights are packed into one parameter, nothing written."""
    ref = folder_in_megatrons_layout(tmp_path, moe=True)
    whole = put_together(pathlib.Path(shares / layout), 2, ep)
    assert sorted(whole) == sorted(ref)
    assert [n for n, ts in whole.items() if len(ts) != 1 or not same_bytes(ts[0], ref[n])] == []
