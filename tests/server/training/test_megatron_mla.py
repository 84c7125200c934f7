"""``init_module_`` on a Megatron-Core ``GPTModel`` with multi-latent attention (issue 43): the
bytes of the DeepSeek-V3-shaped Hugging Face folder (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``
or ``q_proj`` without a q LoRA, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``,
``o_proj``), at TP=1 and TP=2.

Megatron-Core 0.16.1's MLA does not build on CPU with the local layer spec: its ``RotaryEmbedding``
asks CUDA for a device, the local ``DotProductAttention`` takes no ``k_channels``, and it reads
Transformer Engine's absent ``TELinear`` as present. Core attention holds no parameters, so the
test builds MLA with a parameter-free stand-in for it, the rotary table on the CPU and Megatron's
Transformer Engine flag off (in the test only). The reference is the folder put into Megatron's
layout by the test (one Megatron tensor per Hugging Face tensor, ``[gate; up]``); a TP=2 model's
tensors are put together by Megatron's rules (column-parallel rows, row-parallel columns).
"""
from __future__ import annotations

import pathlib
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("megatron.core", reason="megatron-core is in the test extra")

import modelinit  # noqa: E402

from tests.support.distributed import exit_rank, no_collectives, same_bytes, spawn  # noqa: E402
from tests.support.megatron_models import local_mla_without_q_lora  # noqa: E402
from tests.support.megatron_rules import gated_mlp, tp_whole  # noqa: E402

SEED = 13
VOCAB = 1024
#: DeepSeek-V3's attention cut small: 4 heads, a 32-wide q LoRA (or none), a 16-wide KV latent,
#: 8 + 4 query/key dims (no RoPE, RoPE), 8 value dims; every layer dense (first_k_dense_replace).
HF = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 96,
      "moe_intermediate_size": 32, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
      "qk_rope_head_dim": 4, "v_head_dim": 8, "first_k_dense_replace": 2, "n_routed_experts": 4,
      "num_experts_per_tok": 2, "n_shared_experts": 1, "vocab_size": VOCAB, "tie_word_embeddings": False,
      "max_position_embeddings": 128, "rms_norm_eps": 1e-6}
#: DeepSeek-V3 itself, small: layer 0 dense, layer 1 MoE (4 routed experts, top 2, a shared expert,
#: the router's sigmoid scores and expert bias: ``mlp.gate.e_score_correction_bias``).
MOE = {**HF, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}
_MOE_FIELDS = dict(num_moe_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2, moe_layer_freq=[0, 1],
                   moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
                   moe_router_enable_expert_bias=True, moe_router_dtype="fp32")

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),  # Megatron warns that Apex/TE are absent
              pytest.mark.slow]


class _CoreAttention(torch.nn.Module):
    """A stand-in for core attention (which holds no parameters): what MLA builds on CPU."""

    def __init__(self, *args, **kwargs):
        super().__init__()


def _mla_gpt(tp: int = 1, q_lora: int | None = 32, dtype: str = "float32", moe: bool = False):
    """A GPTModel with MLA matching HF (``q_lora``: HF's q_lora_rank; ``moe``: MOE, its layers built
    by Megatron's decoder block spec) on this rank of a TP layout."""
    import megatron.core.transformer.multi_latent_attention as mla
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    from megatron.core.transformer import MLATransformerConfig

    dt = getattr(torch, dtype)
    config = MLATransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=96, tensor_model_parallel_size=tp,
        multi_latent_attention=True, q_lora_rank=q_lora, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4,
        v_head_dim=8, rope_type="rope", qk_layernorm=True, use_cpu_initialization=True, perform_initialization=False,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
        add_bias_linear=False, layernorm_epsilon=1e-6, params_dtype=dt, pipeline_dtype=dt, bf16=dtype == "bfloat16",
        **(_MOE_FIELDS if moe else {}))
    if moe:  # a dense layer, then an MoE one: Megatron's decoder block spec of the config
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm", qk_l2_norm=False)
        layers = spec.layer_specs
    else:
        spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm", multi_latent_attention=True)
        layers = [spec]
    for layer in layers:
        layer.submodules.self_attention.submodules.core_attention = _CoreAttention
    te, device = mla.HAVE_TE, torch.cuda.current_device
    mla.HAVE_TE, torch.cuda.current_device = False, lambda: "cpu"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=128, position_embedding_type="rope")
    finally:
        mla.HAVE_TE, torch.cuda.current_device = te, device


def _reference(tmp_path: pathlib.Path, q_lora: int | None, dtype: str, moe: bool = False) -> dict:
    """The DeepSeek-V3-shaped folder of (HF or MOE, SEED) in Megatron's layout, by a one-process model's names."""
    out = tmp_path / f"hf-{q_lora}-{dtype}-{moe}"
    hf_config = MOE if moe else HF
    with modelinit.Client() as c:
        c.init_model({**hf_config, "q_lora_rank": q_lora}, seed=SEED, out_dir=out, dtype=dtype)
    files = {}
    for f in out.glob("*.safetensors"):
        files.update(safetensors_torch.load_file(f))
    ref = {"embedding.word_embeddings.weight": files["model.embed_tokens.weight"],
           "output_layer.weight": files["lm_head.weight"], "decoder.final_layernorm.weight": files["model.norm.weight"]}
    attention = {"linear_proj": "o_proj", "linear_kv_down_proj": "kv_a_proj_with_mqa", "kv_layernorm": "kv_a_layernorm",
                 "linear_kv_up_proj": "kv_b_proj"}
    attention.update({"linear_q_down_proj": "q_a_proj", "q_layernorm": "q_a_layernorm", "linear_q_up_proj": "q_b_proj"}
                     if q_lora else {"linear_q_proj": "q_proj"})
    for i in range(HF["num_hidden_layers"]):
        hf, layer = f"model.layers.{i}.", f"decoder.layers.{i}."
        for mine, theirs in attention.items():
            ref[f"{layer}self_attention.{mine}.weight"] = files[f"{hf}self_attn.{theirs}.weight"]
        ref[layer + "input_layernorm.weight"] = files[hf + "input_layernorm.weight"]
        ref[layer + "pre_mlp_layernorm.weight"] = files[hf + "post_attention_layernorm.weight"]
        mlps = {"mlp.": "mlp."}
        if i >= hf_config["first_k_dense_replace"]:  # DeepSeek's MoE layer: router, its expert bias, experts, shared
            ref[layer + "mlp.router.weight"] = files[hf + "mlp.gate.weight"]
            ref[layer + "mlp.router.expert_bias"] = files[hf + "mlp.gate.e_score_correction_bias"]
            mlps = {f"mlp.experts.local_experts.{e}.": f"mlp.experts.{e}." for e in range(hf_config["n_routed_experts"])}
            mlps["mlp.shared_experts."] = "mlp.shared_experts."
        for mine, theirs in mlps.items():
            ref.update({layer + mine + k: t for k, t in gated_mlp(files, hf + theirs).items()})
    return ref


#: (q_lora_rank, dtype, MoE) filled and checked, each in float32 too where bfloat16 (Megatron's norms stay float32);
#: without a q LoRA only where this Megatron-Core builds it locally (not 0.19: test_mla_without_a_q_lora says why).
_CASES = tuple(c for c in ((32, "float32", False), (None, "bfloat16", False), (32, "float32", True))
               if c[0] or local_mla_without_q_lora())


def _check_mla_rows() -> None:
    """:func:`mla_rows` against Megatron's own ``get_query_key_value_tensors``: each weight's row r maps
    the probe input to r, so the query, key and value say which row each value came from; the
    RoPE rows come out de-interleaved (pairs (0, 1), (2, 3) as evens then odds), as DeepSeek-V3's
    Hugging Face forward rotates them."""
    from modelinit_server.training.megatron import mla_rows

    heads, nope, rope, v_dim, kv = 4, 8, 4, 8, 16
    rows = mla_rows(heads, nope, rope, v_dim, kv)
    pairs = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    for q_lora in sorted({q for q, _, _ in _CASES}, key=lambda q: q is None):
        attention = _mla_gpt(q_lora=q_lora).decoder.layers[0].self_attention
        attention.q_layernorm = attention.kv_layernorm = torch.nn.Identity()  # no norm between the rows and the output
        with torch.no_grad():
            for p in attention.parameters():
                p.zero_()
            if q_lora:
                attention.linear_q_down_proj.weight[0, 0] = 1  # the latent is e_0
            q_up = attention.linear_q_up_proj if q_lora else attention.linear_q_proj
            q_up.weight[:, 0] = torch.arange(q_up.weight.shape[0])
            attention.linear_kv_down_proj.weight[:, 0] = torch.arange(kv + rope)
            attention.linear_kv_up_proj.weight[:, 1] = torch.arange(heads * (nope + v_dim))  # latent[1] is 1
            hidden = torch.zeros(1, 1, 64)
            hidden[..., 0] = 1
            device, torch.cuda.current_device = torch.cuda.current_device, lambda: "cpu"  # the RoPE table's device
            try:
                q, k, v = attention.get_query_key_value_tensors(hidden)[:3]
            finally:
                torch.cuda.current_device = device
        q_rows = torch.as_tensor(rows["linear_q_up_proj"]).view(heads, nope + rope)
        want_q = torch.cat([q_rows[:, :nope], q_rows[:, nope:][:, pairs]], dim=1)
        kv_rows = torch.as_tensor(rows["linear_kv_up_proj"]).view(heads, nope + v_dim)
        shared = torch.as_tensor(rows["linear_kv_down_proj"])[kv:][pairs].expand(heads, rope)
        assert torch.equal(q.reshape(heads, -1).long(), want_q), q_lora
        assert torch.equal(k.reshape(heads, -1).long(), torch.cat([kv_rows[:, :nope], shared], dim=1)), q_lora
        assert torch.equal(v.reshape(heads, -1).long(), kv_rows[:, nope:]), q_lora


def _fill(rank: int, world: int, init_file: str, out: str) -> None:
    """Each case filled at TP=``world``, then (parallel state made again, TP=1, rank 0 only) at
    TP=1 with :func:`_check_mla_rows`, a fill without spec and a refused spec; saved per TP size."""
    from megatron.core import parallel_state as ps

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    for tp in (world, 1):
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(tensor_model_parallel_size=tp)
        if tp == 1 and rank:
            break
        if tp == 1:
            _check_mla_rows()
        for q_lora, dtype, moe in _CASES:
            _fill_case(tp, rank, q_lora, dtype, moe, out)
    exit_rank()


def _state(model) -> dict:
    return {n: t.detach().clone() for n, t in model.state_dict().items()
            if t is not None and t.is_floating_point() and not n.endswith("_extra_state")}


def _fill_case(tp: int, rank: int, q_lora: int | None, dtype: str, moe: bool, out: str) -> None:
    model = _mla_gpt(tp, q_lora, dtype, moe)
    with no_collectives():
        summary = modelinit.init_module_(model, seed=SEED, spec={**(MOE if moe else HF), "q_lora_rank": q_lora})
    assert summary.architecture == "DeepseekV3ForCausalLM" and summary.missing == 0
    assert summary.dtypes == tuple(sorted({dtype, "float32"}))
    state = _state(model)
    assert summary.elements == sum(t.numel() for t in state.values())
    torch.save(state, f"{out}/tp{tp}-{q_lora}-{moe}-rank{rank}.pt")
    if tp > 1:
        return
    derived = _mla_gpt(tp, q_lora, dtype, moe)
    with no_collectives():  # no spec: DeepSeek-V3's config derived from the MLATransformerConfig, the same bytes
        own = modelinit.init_module_(derived, seed=SEED)
    given = {**(MOE if moe else HF), "q_lora_rank": q_lora}
    differ = {k: (v, own.derived_config.get(k)) for k, v in given.items() if own.derived_config.get(k, v) != v}
    assert differ == {}, differ
    if moe:  # DeepSeek's MoE derived: its routing, the shared expert's width in routed experts, layer 0 dense
        assert {k: own.derived_config[k] for k in ("n_routed_experts", "n_shared_experts", "first_k_dense_replace",
                                                   "routed_scaling_factor", "norm_topk_prob")} == \
            {"n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 1.0,
             "norm_topk_prob": True}
    else:
        assert {"n_routed_experts", "rope_scaling"}.isdisjoint(own.derived_config)
        assert own.fingerprint == summary.fingerprint
    mine = dict(model.named_parameters())
    assert all(same_bytes(p, mine[n]) for n, p in derived.named_parameters())
    if q_lora:  # a spec without the q LoRA: the model's q_a_proj is refused by name, nothing written
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        with pytest.raises(ValueError, match=r"^module: Megatron's 'decoder\.layers\.0\.self_attention\."
                                             r"linear_q_down_proj\.weight' holds 'model\.layers\.0\.self_attn\."
                                             r"q_a_proj\.weight', which the spec \(DeepseekV3ForCausalLM\) does not have"):
            modelinit.init_module_(model, seed=SEED, spec={**HF, "q_lora_rank": None})
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


_ROWS = ("word_embeddings.weight", "output_layer.weight", "linear_q_proj.weight", "linear_q_down_proj.weight",
         "linear_q_up_proj.weight", "linear_kv_down_proj.weight", "linear_kv_up_proj.weight")


def _put_together(shares: list[dict]) -> dict:
    """A TP layout's tensors by Megatron's rules: column-parallel rows (the down projections' latent
    rows included, as the local spec builds them), row-parallel columns, SwiGLU's [gate_r; up_r]."""
    return {name: tp_whole(name, [s[name] for s in shares], _ROWS, ("linear_proj.weight", "linear_fc2.weight"))
            for name in shares[0]}


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available")
def test_mla_equals_the_deepseek_v3_folder(tmp_path):
    """MLA with a q LoRA (float32) and without (bfloat16; its norms float32), and DeepSeek-V3's
    MoE layer after a dense one (the layers saved one key each: ``decoder.layers.<i>.*``), at TP=2 (each rank its
    heads' rows of the up projections and ``linear_q_proj``, its rows of the down projections, its
    columns of ``linear_proj``) and TP=1: every parameter is the DeepSeek-V3-shaped folder's bytes;
    at TP=1 the same without a spec (DeepSeek-V3's config derived from the MLATransformerConfig, its
    MoE layer's routing included),
    :func:`mla_rows` checked against Megatron's own split, and a spec without the q LoRA refused by
    name before anything is written."""
    refs = {}
    for q_lora, dtype, moe in _CASES:
        for d in sorted({dtype, "float32"}):
            refs[(q_lora, d, moe)] = _reference(tmp_path, q_lora, d, moe)
    out = tmp_path / "shares"
    out.mkdir()
    spawn(_fill, (2, str(tmp_path / "pg"), str(out)), 2)
    for tp in (2, 1):
        for q_lora, dtype, moe in _CASES:
            got = _put_together([torch.load(out / f"tp{tp}-{q_lora}-{moe}-rank{r}.pt") for r in range(tp)])
            ref = refs[(q_lora, dtype, moe)]
            assert sorted(got) == sorted(ref)
            bad = [n for n in ref
                   if not same_bytes(got[n], refs[(q_lora, str(got[n].dtype).removeprefix("torch."), moe)][n])]
            assert bad == [], (tp, q_lora, moe)
            assert any(t.dtype == torch.float32 for t in got.values())


def test_mla_without_a_q_lora():
    """DeepSeek-V2-Lite-style MLA (a kv norm, no q LoRA) is among the cases above where this
    Megatron-Core builds it with the local spec; 0.19 refuses to (its ``QKNormConfigResolver``:
    "q_layernorm ... is non-trivial, but q_lora_rank is None", the local backend having no fused
    norm+linear, Megatron-LM PR #4452), so there only Transformer Engine's spec builds it: a GPU run."""
    if not local_mla_without_q_lora():
        pytest.skip("Megatron-Core >= 0.19 builds MLA without a q LoRA only with Transformer Engine's spec (its "
                    "QKNormConfigResolver refuses the local one, Megatron-LM PR #4452)")
    assert (None, "bfloat16", False) in _CASES
