"""The Hugging Face families the native stacks map, in one table: for each ``model_type``, the class its
config names and, for an MoE family, how it names what an MoE layer holds. The config derivations
(``torchtitan_config``, ``megatron.config``) and the name mapping (``megatron.names``) read it here.

The MoE names are the checkpoint's, after ``model.layers.N.``: the routed experts (``{}``: the
expert's index) and their three projections (gate, up, down), the router, its expert bias
(DeepSeek's ``e_score_correction_bias``), the shared experts and their gate (Qwen2-MoE's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MoeNames:
    """How a Hugging Face MoE family names what an MoE layer holds (after ``model.layers.N.``)."""

    experts: str = "mlp.experts.{}."
    expert_mlp: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    router: str = "mlp.gate.weight"
    expert_bias: str = "mlp.gate.e_score_correction_bias"
    """The router's expert bias (Megatron's ``moe_router_enable_expert_bias``; DeepSeek-V3, GLM-4-MoE)."""
    shared: str = "mlp.shared_experts."
    shared_gate: str | None = None
    """The shared expert's sigmoid gate (Megatron's ``moe_shared_expert_gate``)."""


@dataclass(frozen=True)
class Family:
    """A Hugging Face family a stack's model is derived as."""

    model_type: str
    architecture: str
    """The causal-LM class its config names (``architectures[0]``)."""
    moe: MoeNames | None = None
    """How it names an MoE layer's tensors; None for a dense family."""


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM"),
    Family("qwen2", "Qwen2ForCausalLM"),
    Family("qwen3", "Qwen3ForCausalLM"),
    Family("starcoder2", "Starcoder2ForCausalLM"),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", MoeNames()),
    Family("mixtral", "MixtralForCausalLM", MoeNames(experts="block_sparse_moe.experts.{}.", expert_mlp=("w1", "w3", "w2"),
                                                    router="block_sparse_moe.gate.weight")),
    Family("qwen2_moe", "Qwen2MoeForCausalLM", MoeNames(shared="mlp.shared_expert.",
                                                       shared_gate="mlp.shared_expert_gate.weight")),
    Family("glm4_moe", "Glm4MoeForCausalLM", MoeNames()),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", MoeNames()),
    Family("nemotron_h", "NemotronHForCausalLM"),  # Megatron's HybridModel with Mamba layers (megatron.hybrid)
)}


def header(model_type: str) -> dict[str, Any]:
    """The first keys of a derived config document: its class and ``model_type``."""
    return {"architectures": [FAMILIES[model_type].architecture], "model_type": model_type}


def moe_names(model_type: str) -> MoeNames:
    """How ``model_type`` names an MoE layer's tensors (DeepSeek's and Qwen3-MoE's names for a family
    the table does not hold: the spec's own names then decide what is found)."""
    family = FAMILIES.get(model_type)
    return family.moe if family is not None and family.moe is not None else MoeNames()
