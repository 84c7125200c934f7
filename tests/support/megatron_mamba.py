"""A Megatron-Core ``HybridModel`` with Mamba layers (``M``) and an MoE layer (``E``), built on CPU, and the Hugging Face
(Nemotron-H) folder of it in Megatron's layout, by the test's own conversion.

Megatron's ``MambaMixer`` needs ``mamba_ssm`` (its Triton kernels and gated RMSNorm) and asks CUDA for
its device. While :func:`mamba_without_cuda` is entered, the mixer is built here as Megatron builds it,
with four things replaced, in the test only:

* ``mamba_ssm`` is found (``HAVE_MAMBA_SSM``): its kernels serve only the forward, which is not run;
* its gated RMSNorm (Megatron's ``ExtendedRMSNorm`` subclasses ``mamba_ssm``'s ``RMSNormGated``) is
  :class:`GatedNorm`: the same one weight of ``d_inner / TP`` elements, sharded along dim 0 by
  Megatron's ``make_sharded_tensors_for_checkpoint`` as ``ExtendedRMSNorm.sharded_state_dict`` does;
* ``get_cuda_rng_tracker().fork()`` does nothing (it only picks the CUDA generator for Megatron's own
  init, which ``init_module_`` overwrites);
* ``torch.cuda.current_device()`` is the CPU, where every parameter is then allocated.

Every parameter's shape, its tensor-parallel split and what ``sharded_state_dict()`` says of it
(``in_proj`` as its parts ``z, x, B, C, dt``, ``conv1d`` as ``x, B, C``) is Megatron's own code. The
real mixer needs a CUDA machine with ``mamba_ssm``, which publishes no wheel on PyPI (its sdist compiles
CUDA kernels): not run yet.

megatron-core is imported inside the functions: the tests skip without it first.
"""
from __future__ import annotations

import contextlib
import importlib
import pathlib
import warnings
from typing import Iterator

import torch

import modelinit
from tests.support import megatron_models
from tests.support.megatron_models import PADDED, SEED, files_of
from tests.support.megatron_rules import qkv_per_group, tp_whole

#: Two Mamba, two attention, an MoE and an MLP layer; split into four pipeline segments (at PP=2 x VP=2,
#: pipeline stage s's model chunk v holds segment v * 2 + s: Megatron's select_pipeline_segment).
MAMBA_PATTERN, MAMBA_VP = "M*EM*-", "M*|E|M*|-"
#: The Nemotron-H config of :func:`megatron_mamba_hybrid` (16 Mamba heads of 8 in 2 groups, a state of 16).
NEMOTRON_H = {"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "vocab_size": PADDED,
              "hidden_size": 64, "hybrid_override_pattern": MAMBA_PATTERN, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 96, "mlp_hidden_act": "relu2",
              "ssm_state_size": 16, "mamba_num_heads": 16, "mamba_head_dim": 8, "n_groups": 2, "conv_kernel": 4,
              "tie_word_embeddings": False, "max_position_embeddings": 128, "layer_norm_epsilon": 1e-5,
              "n_routed_experts": 4, "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48,
              "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
              "norm_topk_prob": True}
#: Its MoE layer's TransformerConfig fields: sigmoid scores with the expert bias, a shared expert.
MOE_FIELDS = dict(num_moe_experts=4, moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=48, moe_router_topk=2,
                  moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)
#: Per Mamba mixer: d_inner (heads x head dim) and the B/C rows (groups x state).
D_INNER, BC = 16 * 8, 2 * 16


class GatedNorm(torch.nn.Module):
    """``mamba_ssm``'s gated RMSNorm as Megatron's ``ExtendedRMSNorm`` holds and saves it: one weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size=None, norm_before_gate: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core import parallel_state as ps
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0},
                                                   sharded_offsets, tp_group=ps.get_tensor_model_parallel_group(),
                                                   dp_cp_group=metadata["dp_cp_group"])


class _NoFork:
    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()


@contextlib.contextmanager
def mamba_without_cuda() -> Iterator[None]:
    """While inside, Megatron's ``MambaMixer`` is built on CPU without ``mamba_ssm`` (the module's docstring)."""
    from megatron.core.ssm import mamba_mixer

    saved = {k: getattr(mamba_mixer, k) for k in ("HAVE_MAMBA_SSM", "ExtendedRMSNorm", "get_cuda_rng_tracker")}
    device = torch.cuda.current_device
    mamba_mixer.HAVE_MAMBA_SSM, mamba_mixer.ExtendedRMSNorm = True, GatedNorm
    mamba_mixer.get_cuda_rng_tracker = _NoFork
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(mamba_mixer, k, v)
        torch.cuda.current_device = device


def local_mamba_stack_spec(config):
    """The local hybrid stack spec (:func:`tests.support.megatron_models.local_hybrid_stack_spec`) with a
    ``M`` layer of local modules: the MambaLayer's own norm, a MambaMixer of ColumnParallelLinear
    ``in_proj`` and RowParallelLinear ``out_proj``."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.ssm.mamba_layer import MambaLayer, MambaLayerSubmodules
    from megatron.core.ssm.mamba_mixer import MambaMixer, MambaMixerSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from tests.support.megatron_models import local_hybrid_stack_spec

    spec = local_hybrid_stack_spec(config)
    spec.submodules.mamba_layer = ModuleSpec(module=MambaLayer, submodules=MambaLayerSubmodules(
        norm=WrappedTorchNorm, mixer=ModuleSpec(module=MambaMixer, submodules=MambaMixerSubmodules(
            in_proj=ColumnParallelLinear, out_proj=RowParallelLinear)), mamba_bda=get_bias_dropout_add))
    return spec


def megatron_mamba_hybrid(tp: int = 1, pp: int = 1, pattern: str = MAMBA_PATTERN, vp_stage: int | None = None,
                          position_embedding_type: str = "none", te_spec: bool = False, **over):
    """A HybridModel of ``pattern`` (NEMOTRON_H's layers: Mamba, attention, squared-ReLU MLP) of local
    modules, on this rank of a (tp, pp) layout, built under :func:`mamba_without_cuda`; HybridStack's
    TENorm final norm is the local RMSNorm while it is built. ``te_spec``: Megatron's own Transformer Engine
    hybrid stack spec (``hybrid_layer_specs.hybrid_stack_spec``: each layer's norm fused into the linear
    after it, TEGroupedMLP experts), inside :func:`tests.support.megatron_te.transformer_engine_stand_in`."""
    from megatron.core import parallel_state as ps
    from megatron.core.activations import squared_relu
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.models.hybrid.hybrid_model import HybridModel
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    fields = dict(num_layers=len(pattern.replace("|", "")), hidden_size=64, num_attention_heads=8, num_query_groups=2,
                  kv_channels=8, ffn_hidden_size=96, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                  use_cpu_initialization=True, perform_initialization=False, gated_linear_unit=False,
                  activation_func=squared_relu, normalization="RMSNorm", add_bias_linear=False, layernorm_epsilon=1e-5,
                  mamba_state_dim=16, mamba_head_dim=8, mamba_num_groups=2, params_dtype=torch.float32,
                  pipeline_dtype=torch.float32, **MOE_FIELDS)
    fields.update(over, moe_grouped_gemm=te_spec)
    config = TransformerConfig(**fields)
    te_norm = hybrid_block.TENorm
    if te_spec:
        spec = importlib.import_module("megatron.core.models.hybrid.hybrid_layer_specs").hybrid_stack_spec
    else:
        hybrid_block.TENorm, spec = WrappedTorchNorm, local_mamba_stack_spec(config)
    try:
        with warnings.catch_warnings(), mamba_without_cuda():
            warnings.simplefilter("ignore")
            return HybridModel(config, spec, vocab_size=PADDED, max_sequence_length=128,
                               hybrid_layer_pattern=pattern, position_embedding_type=position_embedding_type,
                               pre_process=ps.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                               post_process=ps.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage),
                               vp_stage=vp_stage)
    finally:
        hybrid_block.TENorm = te_norm


def folder_in_mamba_layout(tmp_path: pathlib.Path, pattern: str = MAMBA_PATTERN) -> dict:
    """The Hugging Face folder of (NEMOTRON_H, SEED) under a one-process HybridModel's parameter names
    (and the router's ``expert_bias`` buffer): layer ``k`` is symbol ``k``; its norm as the Mamba layer's
    ``norm``, the attention's input norm or the MLP's or MoE's pre-MLP norm; a mixer's tensors as they
    are (``conv1d`` as ``conv1d_weight``/``conv1d_bias``); q, k, v per query group; ``up_proj``/
    ``down_proj`` as ``linear_fc1``/``linear_fc2`` (a routed expert's, the shared expert's); the gate as
    the router, its ``e_score_correction_bias`` as ``expert_bias``."""
    out = tmp_path / "nemotron-h"
    with modelinit.Client() as c:
        c.init_model(NEMOTRON_H, seed=SEED, out_dir=out, dtype="float32")
    files = files_of(out)
    ref = {"embedding.word_embeddings.weight": files["backbone.embeddings.weight"],
           "output_layer.weight": files["lm_head.weight"], "decoder.final_norm.weight": files["backbone.norm_f.weight"]}
    for k, symbol in enumerate(pattern.replace("|", "")):
        hf, mine = f"backbone.layers.{k}.", f"decoder.layers.{k}."
        mixer = {n.removeprefix(hf + "mixer."): t for n, t in files.items() if n.startswith(hf + "mixer.")}
        if symbol == "M":
            ref[mine + "norm.weight"] = files[hf + "norm.weight"]
            ref.update({mine + "mixer." + n.replace("conv1d.", "conv1d_"): t for n, t in mixer.items()})
        elif symbol == "*":
            ref[mine + "input_layernorm.weight"] = files[hf + "norm.weight"]
            ref[mine + "self_attention.linear_qkv.weight"] = qkv_per_group(
                *(mixer[f"{p}_proj.weight"] for p in "qkv"), NEMOTRON_H["num_key_value_heads"], NEMOTRON_H["head_dim"])
            ref[mine + "self_attention.linear_proj.weight"] = mixer["o_proj.weight"]
        elif symbol == "-":
            ref[mine + "pre_mlp_layernorm.weight"] = files[hf + "norm.weight"]
            ref[mine + "mlp.linear_fc1.weight"] = mixer["up_proj.weight"]
            ref[mine + "mlp.linear_fc2.weight"] = mixer["down_proj.weight"]
        else:  # E: the router and its expert bias, each routed expert, the shared expert
            ref[mine + "pre_mlp_layernorm.weight"] = files[hf + "norm.weight"]
            ref[mine + "mlp.router.weight"] = mixer["gate.weight"]
            ref[mine + "mlp.router.expert_bias"] = mixer["gate.e_score_correction_bias"]
            for e in range(NEMOTRON_H["n_routed_experts"]):
                ref[f"{mine}mlp.experts.local_experts.{e}.linear_fc1.weight"] = mixer[f"experts.{e}.up_proj.weight"]
                ref[f"{mine}mlp.experts.local_experts.{e}.linear_fc2.weight"] = mixer[f"experts.{e}.down_proj.weight"]
            ref[mine + "mlp.shared_experts.linear_fc1.weight"] = mixer["shared_experts.up_proj.weight"]
            ref[mine + "mlp.shared_experts.linear_fc2.weight"] = mixer["shared_experts.down_proj.weight"]
    return ref


#: Each layer's norm (by symbol) as the Transformer Engine hybrid spec fuses it into the linear after it
#: (an MoE layer keeps its pre-MLP norm apart).
TE_FUSED_NORMS = {"M": ("norm.weight", "mixer.in_proj.layer_norm_weight"),
                  "*": ("input_layernorm.weight", megatron_models.TE_FUSED_NORMS["input_layernorm."] + "weight"),
                  "-": ("pre_mlp_layernorm.weight", megatron_models.TE_FUSED_NORMS["pre_mlp_layernorm."] + "weight")}


def in_te_hybrid_names(ref: dict, pattern: str = MAMBA_PATTERN) -> dict:
    """:func:`folder_in_mamba_layout`'s tensors under the Transformer Engine hybrid spec's names."""
    out = dict(ref)
    for k, symbol in enumerate(pattern.replace("|", "")):
        if symbol in TE_FUSED_NORMS:
            local, fused = TE_FUSED_NORMS[symbol]
            out[f"decoder.layers.{k}.{fused}"] = out.pop(f"decoder.layers.{k}.{local}")
    return out


#: A TP rank's rows of a mixer's fused tensors, part by part: in_proj's [z, x, B, C, dt], conv1d's [x, B, C].
_PARTS = {"mixer.in_proj.weight": (D_INNER, D_INNER, BC, BC, 16), "mixer.conv1d_weight": (D_INNER, BC, BC),
          "mixer.conv1d_bias": (D_INNER, BC, BC)}
#: megatron_models' split rules, and the mixer's: its per-head and per-channel tensors by rows, out_proj by columns.
ROWS = (*megatron_models.ROWS, "mixer.dt_bias", "mixer.A_log", "mixer.D", "mixer.norm.weight")
COLUMNS = (*megatron_models.COLUMNS, "mixer.out_proj.weight")


def mamba_tp_whole(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The whole tensor from its TP ranks' ``parts`` by Megatron's rules: a fused mixer tensor part by part
    (each rank holds its rows of every part), the others as :func:`~tests.support.megatron_rules.tp_whole`."""
    fused = next((sizes for suffix, sizes in _PARTS.items() if name.endswith(suffix)), None)
    if fused is None:
        return tp_whole(name, parts, ROWS, COLUMNS, gated=False)
    local = [n // len(parts) for n in fused]
    pieces = [p.split(local) for p in parts]
    return torch.cat([pieces[r][i] for i in range(len(fused)) for r in range(len(parts))])


def put_mamba_together(out: pathlib.Path, ep: int = 1) -> dict:
    """The one-process model's tensors from the shares saved in ``out`` (``*.pt``: a rank's model or
    model chunk, with its ``tp`` and ``ep`` ranks, the global index of its ``first`` layer and its
    ``state``): layers renumbered from their chunk's first, an EP rank's experts from its first, TP
    shards by :func:`mamba_tp_whole` (an expert is held whole by one rank where the experts' TP is 1).
    A tensor held twice by one TP rank is an error."""
    by_name: dict[str, dict[int, torch.Tensor]] = {}
    for f in sorted(out.glob("*.pt")):
        share = torch.load(f)
        for name, t in share["state"].items():
            name = megatron_models.global_name(name, share["first"], share["ep"], NEMOTRON_H["n_routed_experts"] // ep)
            held = by_name.setdefault(name, {})
            assert share["tp"] not in held, f"{name} is held twice by TP rank {share['tp']}"
            held[share["tp"]] = t
    return {n: mamba_tp_whole(n, [by_tp[k] for k in sorted(by_tp)]) for n, by_tp in by_name.items()}
