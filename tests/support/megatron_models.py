"""The Megatron-Core models the Megatron tests share: a Qwen3-style ``GPTModel`` cut small (and its
MoE and Starcoder2-style variants) built with Megatron's local layer spec on CPU, the Hugging Face
folder of its config put into Megatron's layout by the test's own conversion
(:mod:`tests.support.megatron_rules`), a gloo group of one in a process of its own, and the ranks'
shares put together by Megatron's rules (never by ``init_module_``'s map).

megatron-core is imported inside the functions: the tests skip without it first.
"""
from __future__ import annotations

import importlib
import pathlib
import warnings

import safetensors.torch as safetensors_torch
import torch
import torch.distributed as dist

import modelinit
from tests.support.distributed import exit_rank, same_bytes, spawn
from tests.support.megatron_rules import gated_mlp, qkv_per_group, tp_whole

def no_legacy_grouped_mlp() -> str | None:
    """Why this Megatron-Core has no non-Transformer-Engine ``GroupedMLP`` (None where it has one):
    Megatron-LM PR #3410 removed it with ``grouped_gemm_util`` (first absent in 0.17.0); grouped
    experts are then ``TEGroupedMLP`` only, which needs Transformer Engine (a GPU machine's run)."""
    import megatron.core

    try:
        from megatron.core.transformer.moe import grouped_gemm_util  # noqa: F401
    except ImportError:
        return (f"Megatron-Core {megatron.core.__version__} has no non-Transformer-Engine GroupedMLP (removed in "
                f"0.17, Megatron-LM PR #3410; its grouped experts are TEGroupedMLP, which needs Transformer Engine)")
    return None


def local_mla_without_q_lora() -> bool:
    """Whether this Megatron-Core builds the local MLA spec without a q LoRA: 0.19's
    ``QKNormConfigResolver`` refuses it ("q_layernorm ... is non-trivial, but q_lora_rank is None"), the
    local backend having no fused norm+linear (Megatron-LM PR #4452)."""
    try:
        from megatron.core.transformer import mla_qk_norm_config  # noqa: F401
    except ImportError:
        return True
    return False


#: The seed every test of a model of this module fills with.
SEED = 11
VOCAB, PADDED = 1000, 1024
#: A Qwen3-style model (q/k norms, grouped-query attention: 8 heads in 2 groups, head_dim 8 over a
#: 64-wide model, SwiGLU), cut small for speed.
HF = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "head_dim": 8,
      "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 96,
      "vocab_size": VOCAB, "tie_word_embeddings": False, "max_position_embeddings": 128, "rms_norm_eps": 1e-6}

#: The same as a Qwen3 MoE: every layer's MLP is 4 routed experts (SwiGLU, 32 wide), top-2, and a router.
MOE = {**HF, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "moe_intermediate_size": 32,
       "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
       "norm_topk_prob": True}
MOE_FIELDS = dict(num_moe_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2)
#: A Starcoder2-style model: LayerNorm with biases, biases on every linear, a GELU MLP (not gated).
STARCODER2 = {"model_type": "starcoder2", "architectures": ["Starcoder2ForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 96,
              "vocab_size": VOCAB, "use_bias": True, "tie_word_embeddings": False, "max_position_embeddings": 128}
STARCODER2_FIELDS = dict(normalization="LayerNorm", gated_linear_unit=False, add_bias_linear=True, add_qkv_bias=True,
                          qk_layernorm=False)

def megatron_gpt(tp: int = 1, pp: int = 1, dtype: str = "float32", tied: bool = False, vocab: int = PADDED, moe: bool = False,
         ep: int = 1, layernorm: bool = False, vp_stage: int | None = None, te_experts: bool = False,
                 te_spec: bool = False, **over):
    """A GPTModel matching HF (MOE: with SequentialMLP experts, or ``te_experts`` Transformer Engine's
    ``TEGroupedMLP``; ``ep`` ways expert parallel; ``te_spec``: built with Megatron's Transformer Engine
    layer spec, each norm fused into the linear after it) on this
    rank of a (tp, pp) layout (parallel_state set up by the caller); ``vp_stage``: this rank's
    model chunk ``vp_stage`` of an interleaved pipeline (``virtual_pipeline_model_parallel_size``
    in ``over``), built as Megatron's training loop builds it. ``rope_scaling``/``rope_scaling_factor``
    in ``over`` go to GPTModel (Llama 3.x's RoPE scaling), the rest to its TransformerConfig."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    dt = getattr(torch, dtype)
    fields = dict(num_layers=4, hidden_size=64, num_attention_heads=8, num_query_groups=2, kv_channels=8,
                  ffn_hidden_size=96, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                  use_cpu_initialization=True, perform_initialization=False, gated_linear_unit=True,
                  activation_func=torch.nn.functional.silu, normalization="RMSNorm", add_bias_linear=False,
                  qk_layernorm=True, params_dtype=dt, pipeline_dtype=dt, bf16=dtype == "bfloat16")
    if moe:
        fields.update(MOE_FIELDS, expert_model_parallel_size=ep)
    if layernorm:
        fields.update(STARCODER2_FIELDS, activation_func=torch.nn.functional.gelu)
    rope = {k: over.pop(k) for k in ("rope_scaling", "rope_scaling_factor") if k in over}
    fields.update(over)
    config = TransformerConfig(**fields)
    if te_spec:  # inside megatron_te.transformer_engine_stand_in(), or with Transformer Engine installed
        specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
        spec = specs.get_gpt_layer_with_transformer_engine_spec(num_experts=config.num_moe_experts,
                                                                moe_grouped_gemm=config.moe_grouped_gemm,
                                                                qk_layernorm=config.qk_layernorm)
    else:
        spec = get_gpt_layer_local_spec(num_experts=config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm,
                                        qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    if te_experts:  # inside megatron_te.transformer_engine_stand_in()
        from tests.support.megatron_te import with_te_grouped_experts

        spec = with_te_grouped_experts(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GPTModel(config, spec, vocab_size=vocab, max_sequence_length=128, position_embedding_type="rope",
                        share_embeddings_and_output_weights=tied, **rope,
                        pre_process=ps.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                        post_process=ps.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                        vp_stage=vp_stage)


#: The local spec's norms as the Transformer Engine spec fuses them into the linear after them.
TE_FUSED_NORMS = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_",
                  "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def in_te_spec_names(state: dict, moe: bool = False) -> dict:
    """A local-spec model's tensors under the Transformer Engine spec's names (its fused norms; an MoE
    layer keeps its pre-MLP norm apart, as the router and the experts each read it)."""
    fusing = {k: v for k, v in TE_FUSED_NORMS.items() if not (moe and k == "pre_mlp_layernorm.")}
    out = {}
    for n, t in state.items():
        for local, fused in fusing.items():
            head, found, leaf = n.partition(local)
            if found and head.startswith("decoder.layers."):
                n = head + fused + leaf
        out[n] = t
    return out


def has_hybrid_model() -> bool:
    """Whether this Megatron-Core has ``HybridModel`` (0.17 and later: ``megatron.core.models.hybrid``)."""
    try:
        from megatron.core.models.hybrid.hybrid_model import HybridModel  # noqa: F401
    except ImportError:
        return False
    return True


def local_hybrid_stack_spec(config):
    """A hybrid stack spec of Megatron's local modules (Megatron ships only a Transformer Engine one,
    ``hybrid_layer_specs.hybrid_stack_spec``): its ``*`` layer is the local GPT layer's attention half
    (input norm, SelfAttention of ColumnParallelLinear/DotProductAttention/RowParallelLinear, q/k
    norms), its ``-`` an MLPLayer of the local GPT layer's MLP half (pre-MLP norm, MLP), its ``E`` the
    local MoE layer's (SequentialMLP experts). No ``sharded_state_dict_keys_map``: the norms keep their
    own names, as a layer spec written for a HybridModel has them."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.models.hybrid.hybrid_block import HybridStack, HybridStackSubmodules
    from megatron.core.ssm.mlp_layer import MLPLayer
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import (MoETransformerLayer, TransformerLayer,
                                                             TransformerLayerSubmodules)

    dense = get_gpt_layer_local_submodules(qk_layernorm=config.qk_layernorm, normalization=config.normalization)
    moe = get_gpt_layer_local_submodules(num_experts=config.num_moe_experts or 4, qk_layernorm=config.qk_layernorm,
                                         normalization=config.normalization)
    attention = TransformerLayerSubmodules(input_layernorm=dense.input_layernorm, self_attention=dense.self_attention,
                                           self_attn_bda=dense.self_attn_bda)

    def mlp_half(of):
        return TransformerLayerSubmodules(pre_mlp_layernorm=of.pre_mlp_layernorm, mlp=of.mlp, mlp_bda=of.mlp_bda)

    return ModuleSpec(module=HybridStack, submodules=HybridStackSubmodules(
        attention_layer=ModuleSpec(module=TransformerLayer, submodules=attention),
        mlp_layer=ModuleSpec(module=MLPLayer, submodules=mlp_half(dense)),
        moe_layer=ModuleSpec(module=MoETransformerLayer, submodules=mlp_half(moe))))


#: The hybrid pattern of HF's 4 layers (as MOE's with experts in layers 1 and 3), and split into 2 stages.
HYBRID_PATTERN, HYBRID_PP2 = "*-*E*-*E", "*-*E|*-*E"
#: HF as the Qwen3-MoE a hybrid pattern of ``*-`` and ``*E`` layers is: layers 0 and 2 dense.
HYBRID_MOE = {**MOE, "intermediate_size": 96, "mlp_only_layers": [0, 2]}


def megatron_hybrid(tp: int = 1, pp: int = 1, ep: int = 1, pattern: str = HYBRID_PATTERN, dtype: str = "float32",
                    vocab: int = PADDED, vp_stage: int | None = None, **over):
    """A HybridModel of ``pattern`` with HYBRID_MOE's layers (``*-*E``: attention, dense MLP,
    attention, MoE), local modules (:func:`local_hybrid_stack_spec`), on this rank of a (tp, pp, ep)
    layout; HybridStack's final norm, Transformer Engine's TENorm whatever the spec, is the local
    RMSNorm while it is built (the one way to build a HybridModel without Transformer Engine)."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    dt = getattr(torch, dtype)
    fields = dict(num_layers=len(pattern.replace("|", "")), hidden_size=64, num_attention_heads=8, num_query_groups=2,
                  kv_channels=8, ffn_hidden_size=96, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                  expert_model_parallel_size=ep, use_cpu_initialization=True, perform_initialization=False,
                  gated_linear_unit=True, activation_func=torch.nn.functional.silu, normalization="RMSNorm",
                  add_bias_linear=False, qk_layernorm=True, params_dtype=dt, pipeline_dtype=dt,
                  bf16=dtype == "bfloat16", layernorm_epsilon=1e-6, **MOE_FIELDS)
    fields.update(over)
    config = TransformerConfig(**fields)
    te_norm = hybrid_block.TENorm
    hybrid_block.TENorm = WrappedTorchNorm
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return HybridModel(config, local_hybrid_stack_spec(config), vocab_size=vocab, max_sequence_length=128,
                               hybrid_layer_pattern=pattern, position_embedding_type="rope", rotary_base=10000,
                               pre_process=ps.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                               post_process=ps.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                               vp_stage=vp_stage)
    finally:
        hybrid_block.TENorm = te_norm


def files_of(out: pathlib.Path) -> dict:
    files = {}
    for f in out.glob("*.safetensors"):
        files.update(safetensors_torch.load_file(f))
    return files


def folder_in_megatrons_layout(tmp_path: pathlib.Path, dtype: str = "float32", tied: bool = False, policy=None, moe: bool = False,
               layernorm: bool = False) -> dict:
    """The Hugging Face folder of (HF, SEED, policy) in Megatron's layout, under a one-process
    model's parameter names: q, k, v concatenated per query group, [gate; up], and the padded
    vocabulary's rows from the folder of the padded vocabulary (its first rows are the same)."""
    hf = {**(MOE if moe else STARCODER2 if layernorm else HF), "tie_word_embeddings": tied}
    out = tmp_path / f"hf-{dtype}-{tied}-{policy}-{moe}-{layernorm}"
    padded = tmp_path / f"hf-padded-{dtype}-{tied}-{policy}-{moe}-{layernorm}"
    with modelinit.Client() as c:
        c.init_model(hf, seed=SEED, out_dir=out, dtype=dtype, policy=policy)
        c.init_model({**hf, "vocab_size": PADDED}, seed=SEED, out_dir=padded, dtype=dtype, policy=policy)
    files, more = files_of(out), files_of(padded)
    groups, head_dim = HF["num_key_value_heads"], HF["head_dim"]  # Starcoder2 has the same
    ref = {}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in files:
            assert torch.equal(more[name][:VOCAB], files[name])  # a padded row never moves the others
            ref[name] = torch.cat([files[name], more[name][VOCAB:]])
    ref = {"embedding.word_embeddings.weight": ref["model.embed_tokens.weight"],
           **({} if tied else {"output_layer.weight": ref["lm_head.weight"]}),
           "decoder.final_layernorm.weight": files["model.norm.weight"],
           **({"decoder.final_layernorm.bias": files["model.norm.bias"]} if layernorm else {})}
    for i in range(HF["num_hidden_layers"]):
        hf_layer, layer = f"model.layers.{i}.", f"decoder.layers.{i}."
        for leaf in ("weight", "bias") if layernorm else ("weight",):
            ref[layer + f"self_attention.linear_qkv.{leaf}"] = qkv_per_group(
                *(files[f"{hf_layer}self_attn.{p}_proj.{leaf}"] for p in "qkv"), groups, head_dim)
        ref[layer + "self_attention.linear_proj.weight"] = files[f"{hf_layer}self_attn.o_proj.weight"]
        if layernorm:  # LayerNorm's biases, the linears' biases, a GELU MLP
            ref[layer + "self_attention.linear_proj.bias"] = files[f"{hf_layer}self_attn.o_proj.bias"]
            for leaf in ("weight", "bias"):
                ref[layer + f"input_layernorm.{leaf}"] = files[f"{hf_layer}input_layernorm.{leaf}"]
                ref[layer + f"pre_mlp_layernorm.{leaf}"] = files[f"{hf_layer}post_attention_layernorm.{leaf}"]
                ref[layer + f"mlp.linear_fc1.{leaf}"] = files[f"{hf_layer}mlp.c_fc.{leaf}"]
                ref[layer + f"mlp.linear_fc2.{leaf}"] = files[f"{hf_layer}mlp.c_proj.{leaf}"]
            continue
        ref[layer + "self_attention.q_layernorm.weight"] = files[f"{hf_layer}self_attn.q_norm.weight"]
        ref[layer + "self_attention.k_layernorm.weight"] = files[f"{hf_layer}self_attn.k_norm.weight"]
        ref[layer + "input_layernorm.weight"] = files[f"{hf_layer}input_layernorm.weight"]
        ref[layer + "pre_mlp_layernorm.weight"] = files[f"{hf_layer}post_attention_layernorm.weight"]
        mlps = {"mlp.": f"{hf_layer}mlp."}
        if moe:
            ref[layer + "mlp.router.weight"] = files[f"{hf_layer}mlp.gate.weight"]
            mlps = {f"mlp.experts.local_experts.{e}.": f"{hf_layer}mlp.experts.{e}." for e in range(MOE["num_experts"])}
        for mine, theirs in mlps.items():
            ref.update({layer + mine + k: t for k, t in gated_mlp(files, theirs).items()})
    return ref


def folder_in_hybrid_layout(tmp_path: pathlib.Path, pattern: str = HYBRID_PATTERN, dtype: str = "float32") -> dict:
    """The Hugging Face folder of (HYBRID_MOE, SEED) in a one-process HybridModel's layout, by
    position as Megatron's migration from GPTModel pairs the weights: layer ``i``'s attention (its
    input norm, q/k/v per query group, q/k norms, o_proj) at the pattern's ``i``-th ``*``, its MLP
    (the post-attention norm as the pre-MLP norm, [gate; up], down; or the router and experts) at the
    symbol after it; the final norm as ``final_norm``; the padded vocabulary's rows from the folder of
    the padded vocabulary."""
    out, padded = tmp_path / f"hybrid-{dtype}", tmp_path / f"hybrid-padded-{dtype}"
    with modelinit.Client() as c:
        c.init_model(HYBRID_MOE, seed=SEED, out_dir=out, dtype=dtype)
        c.init_model({**HYBRID_MOE, "vocab_size": PADDED}, seed=SEED, out_dir=padded, dtype=dtype)
    files, more = files_of(out), files_of(padded)
    ref = {"embedding.word_embeddings.weight": torch.cat([files["model.embed_tokens.weight"],
                                                          more["model.embed_tokens.weight"][VOCAB:]]),
           "output_layer.weight": torch.cat([files["lm_head.weight"], more["lm_head.weight"][VOCAB:]]),
           "decoder.final_norm.weight": files["model.norm.weight"]}
    symbols = pattern.replace("|", "")
    attention = [k for k, s in enumerate(symbols) if s == "*"]
    for i, k in enumerate(attention):
        hf, at, mlp = f"model.layers.{i}.", f"decoder.layers.{k}.", f"decoder.layers.{k + 1}."
        ref[at + "input_layernorm.weight"] = files[hf + "input_layernorm.weight"]
        ref[at + "self_attention.linear_qkv.weight"] = qkv_per_group(
            *(files[f"{hf}self_attn.{p}_proj.weight"] for p in "qkv"), HF["num_key_value_heads"], HF["head_dim"])
        ref[at + "self_attention.linear_proj.weight"] = files[hf + "self_attn.o_proj.weight"]
        ref[at + "self_attention.q_layernorm.weight"] = files[hf + "self_attn.q_norm.weight"]
        ref[at + "self_attention.k_layernorm.weight"] = files[hf + "self_attn.k_norm.weight"]
        ref[mlp + "pre_mlp_layernorm.weight"] = files[hf + "post_attention_layernorm.weight"]
        mlps = {"mlp.": hf + "mlp."}
        if symbols[k + 1] == "E":
            ref[mlp + "mlp.router.weight"] = files[hf + "mlp.gate.weight"]
            mlps = {f"mlp.experts.local_experts.{e}.": f"{hf}mlp.experts.{e}." for e in range(MOE["num_experts"])}
        for mine, theirs in mlps.items():
            ref.update({mlp + mine + name: t for name, t in gated_mlp(files, theirs).items()})
    return ref


def init_group(rank: int, world: int, init_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def in_one_process(init_file: str, body, *args) -> None:
    """``body(*args)`` in a spawned process of its own, a gloo group of one and Megatron's parallel state."""
    spawn(_one, (init_file, body, args), 1)


def _one(rank: int, init_file: str, body, args) -> None:
    from megatron.core import parallel_state as ps

    init_group(0, 1, init_file)
    ps.initialize_model_parallel()
    body(*args)
    exit_rank()


#: How a TP=2 model's tensors are split (Megatron's column- and row-parallel linears, its vocabulary-
#: parallel embedding and output layer); the others (norms) are whole on every rank.
ROWS = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias")
COLUMNS = ("linear_proj.weight", "linear_fc2.weight")


def global_name(name: str, first: int, ep_rank: int, local_experts: int) -> str:
    """A stage's layer numbered from the model's first layer; an expert-parallel rank's local expert
    numbered among all experts."""
    if name.startswith("decoder.layers."):
        i, _, rest = name.removeprefix("decoder.layers.").partition(".")
        if rest.startswith("mlp.experts.local_experts."):
            e, _, tail = rest.removeprefix("mlp.experts.local_experts.").partition(".")
            rest = f"mlp.experts.local_experts.{ep_rank * local_experts + int(e)}.{tail}"
        name = f"decoder.layers.{first + int(i)}.{rest}"
    return name


def put_together(out: pathlib.Path, world: int, ep: int, gated: bool = True) -> dict:
    """The one-process model's tensors from the ranks' shares: TP shards concatenated (linear_fc1's
    [gate_r; up_r] as all gates then all ups), PP stages' layers renumbered from their first, EP
    ranks' experts from theirs; a replica (data parallel) must equal the first."""
    by_name: dict[str, dict[int, list]] = {}
    local_experts = MOE["num_experts"] // ep
    for r in range(world):
        share = torch.load(out / f"rank{r}.pt")
        for name, t in share["state"].items():
            whole = global_name(name, share["first"], share["ep"], local_experts)
            by_name.setdefault(whole, {}).setdefault(share["tp"], []).append(t)
    assembled = {}
    for name, by_tp in by_name.items():
        for copies in by_tp.values():
            assert all(torch.equal(c, copies[0]) for c in copies), name
        assembled[name] = [tp_whole(name, [by_tp[k][0] for k in sorted(by_tp)], ROWS, COLUMNS, gated)]
    return assembled


def chunks_hold_each_tensor_once(out: pathlib.Path, ref: dict) -> dict[str, list[str]]:
    """The virtual-pipeline chunks saved in ``out`` (``rank*-chunk*.pt``: ``first``, the global index of
    the chunk's first layer, and its ``state``), checked: every tensor of ``ref`` held by exactly one
    chunk, with its bytes. Returns each tensor's holder (``rank0-chunk1``)."""
    held: dict[str, list] = {}
    for f in sorted(out.glob("rank*-chunk*.pt")):
        share = torch.load(f)
        for name, t in share["state"].items():
            held.setdefault(global_name(name, share["first"], 0, 1), []).append((f.stem, t))
    assert {n: [c for c, _ in ts] for n, ts in held.items() if len(ts) != 1} == {}
    assert sorted(held) == sorted(ref)
    assert [n for n, ts in held.items() if not same_bytes(ts[0][1], ref[n])] == []
    return {n: ts[0][0] for n, ts in held.items()}


def fsdp2_wrapped(model, experts_apart: bool = False):
    """``model`` wrapped as Megatron's ``--use-torch-fsdp2`` wraps it; ``experts_apart``: each
    layer's experts sharded first over the expert data-parallel group (the ranks that hold the
    same experts), which the wrapper then leaves as they are. The wrapper names CUDA as its
    mesh's device type (``DeviceMesh.from_group(group, "cuda")``); here, on CPU with gloo, the
    mesh is the CPU's, the one thing changed, in this test only: the shards FSDP2 makes (Shard(0)
    of each parameter over the data-parallel group, ``torch.chunk``'s sizes) do not depend on the
    device."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed import torch_fully_sharded_data_parallel as wrapper
    from torch.distributed.device_mesh import DeviceMesh

    class CpuMesh:
        @staticmethod
        def from_group(group, device_type, **kwargs):
            return DeviceMesh.from_group(group, "cpu", **kwargs)

    if experts_apart:
        from megatron.core import parallel_state as ps
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(ps.get_expert_data_parallel_group(), "cpu")
        for layer in model.decoder.layers:
            fully_shard(layer.mlp.experts, mesh=mesh)
    saved, wrapper.DeviceMesh = wrapper.DeviceMesh, CpuMesh
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return wrapper.TorchFullyShardedDataParallel(model.config, DistributedDataParallelConfig(), model)
    finally:
        wrapper.DeviceMesh = saved
