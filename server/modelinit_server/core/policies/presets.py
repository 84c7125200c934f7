"""The named presets (:data:`PRESETS`): rule lists built from the model (its ``initializer_range``,
depth, hidden size), one function per preset, each documenting its source.

``hf-default`` is what transformers' ``_init_weights`` does: the rule recorded from the model
class (``Distribution("recorded")``) or, for the built-in families, the same rules written out.
"""
from __future__ import annotations

import math

from ..tensors import ModelSpec
from .rules import Distribution, Match, Rule

_ONES = Distribution("constant", value=1.0)
_ZEROS = Distribution("constant", value=0.0)


def _norms_and_biases() -> list[Rule]:
    return [
        Rule(Match(kinds=("norm",), params=("weight",)), _ONES, name="norm weight = 1"),
        Rule(Match(params=("bias",)), _ZEROS, name="bias = 0"),
    ]


#: Every tensor's own recorded transformers rule (generic specs).
RECORDED = Distribution("recorded")


def has_recorded_rules(model: ModelSpec) -> bool:
    """Whether ``model``'s tensors carry recorded transformers rules (a generic spec)."""
    return any(t.hf_init is not None for t in model.tensors)


def _hf_default(model: ModelSpec) -> list[Rule]:
    """What transformers' ``_init_weights`` does for the family (see docs/policies.md): the rule
    recorded from the model class itself, or for the built-in families the same rules written out."""
    if has_recorded_rules(model):
        return [Rule(Match(), RECORDED, name="hf-default")]
    normal = Distribution("normal", std=model.initializer_range)
    rules = _norms_and_biases()
    if model.family == "gpt2":
        # GPT2PreTrainedModel._init_weights redraws every "c_proj.weight" (attention and MLP
        # output) with std initializer_range / sqrt(2 * n_layer).
        rules.append(Rule(Match(names=("*.c_proj.weight",)), normal, depth_scaling="n_layers", name="c_proj scaled"))
    rules += [
        Rule(Match(kinds=("embedding",)), normal, zero_padding_row=True, name="embedding"),
        Rule(Match(kinds=("linear",), params=("weight",)), normal, name="linear weight"),
    ]
    return rules


def _bert_tf(model: ModelSpec) -> list[Rule]:
    """Original BERT (TensorFlow): truncated_normal(stddev=0.02) redraws beyond 2 sigma."""
    trunc = Distribution("trunc_normal", std=model.initializer_range, a=-2.0, b=2.0, bounds="sigma")
    return [
        *_norms_and_biases(),
        Rule(_WEIGHTS, trunc, name="weight"),
    ]


#: Kinds whose weights are matrices a preset draws: projections (and MoE experts and routers), tables, convolutions.
_MATRIX_KINDS = ("linear", "expert", "router", "conv")
_WEIGHTS = Match(kinds=(*_MATRIX_KINDS, "embedding"), params=("weight",))
_RESIDUAL_OUT = Match(kinds=("linear", "expert"), roles=("attn_out", "mlp_out"), params=("weight",))
_MATRICES = Match(kinds=_MATRIX_KINDS, params=("weight",))


def _gpt2(model: ModelSpec) -> list[Rule]:
    """GPT-2 (Radford et al. 2019, sec. 2.3; HF ``GPT2PreTrainedModel._init_weights``), any family.

    Every Linear and Embedding weight ~ N(0, 0.02); the residual-stream output projections
    (roles ``attn_out`` and ``mlp_out``) ~ N(0, 0.02 / sqrt(2 * n_layers)); norms 1/0, biases 0;
    no padding row zeroed. The std is the paper's 0.02, not the config's ``initializer_range``.
    """
    normal = Distribution("normal", std=0.02)
    return [
        *_norms_and_biases(),
        Rule(_RESIDUAL_OUT, normal, depth_scaling="n_layers", name="residual out scaled"),
        Rule(_WEIGHTS, normal, name="weight"),
    ]


def _megatron(model: ModelSpec) -> list[Rule]:
    """Megatron-LM: ``init_method_normal(sigma)`` and ``scaled_init_method_normal(sigma, num_layers)``.

    sigma = ``model.initializer_range``: every Linear and Embedding weight (word and position
    embeddings, QKV, MLP in, output layer) ~ N(0, sigma); the attention and MLP output layers
    (roles ``attn_out``, ``mlp_out``) ~ N(0, sigma / sqrt(2 * num_layers)); norms 1/0, biases 0.
    Source: ``megatron/core/utils.py`` (``init_method_normal``, ``scaled_init_method_normal``).
    """
    normal = Distribution("normal", std=model.initializer_range)
    return [
        *_norms_and_biases(),
        Rule(_RESIDUAL_OUT, normal, depth_scaling="n_layers", name="output layer scaled"),
        Rule(_WEIGHTS, normal, name="weight"),
    ]


def _torchtitan_llama3(model: ModelSpec) -> list[Rule]:
    """torchtitan's Llama3 ``init_weights`` (``depth_init=True``), applied by role to any family.

    - token embeddings (and position / token-type embeddings) ~ N(0, 1);
    - wq, wk, wv (``qkv``) and w1 (gate: HF ``gate_proj``, any other ``mlp_in``, and
      ``head_transform``) ~ trunc_normal(std=0.02, a=-2, b=2) with torch's *absolute* bounds,
      i.e. +-100 sigma: effectively untruncated;
    - wo (``attn_out``), w2 (``mlp_out``) and w3 (up: HF ``*.mlp.up_proj.weight``, matched by
      name) ~ trunc_normal(std=0.02 / sqrt(2 * (layer + 1)), a=-2, b=2 absolute);
    - final output (``lm_head`` weight) ~ trunc_normal(std=hidden_size**-0.5, +-3 sigma), effective
      std hidden_size**-0.5 * 0.98657;
    - norms 1, biases 0. A tied ``lm_head`` is stored as the token embedding, so it gets N(0, 1).

    Source: torchtitan ``models/llama3/model.py`` (``Attention.init_weights``,
    ``FeedForward.init_weights``, ``Transformer.init_weights``).
    """
    trunc = Distribution("trunc_normal", std=0.02, a=-2.0, b=2.0, bounds="absolute")
    final_std = model.hidden_size**-0.5
    final = Distribution("trunc_normal", std=final_std, a=-3.0, b=3.0, bounds="sigma")
    return [
        *_norms_and_biases(),
        Rule(Match(kinds=("embedding",), params=("weight",)), Distribution("normal", std=1.0), name="embedding (tok_embeddings)"),
        Rule(Match(kinds=("linear",), roles=("lm_head",), params=("weight",)), final, name="output"),
        Rule(
            Match(kinds=("linear", "expert"), params=("weight",), names=("*.mlp.up_proj.weight", "*.experts.*.w3.weight", "*.experts.*.up_proj.weight")),
            trunc, depth_scaling="layer", name="w3 depth init",
        ),
        Rule(_RESIDUAL_OUT, trunc, depth_scaling="layer", name="wo/w2 depth init"),
        Rule(_MATRICES, trunc, name="wq/wk/wv/w1"),
    ]


def _xavier(model: ModelSpec) -> list[Rule]:
    """Glorot & Bengio 2010: ``torch.nn.init.xavier_uniform_`` (gain 1) for every Linear weight,
    bound sqrt(6 / (fan_in + fan_out)), std sqrt(2 / (fan_in + fan_out)).

    Embeddings: ``xavier_normal_`` (gain 1), std sqrt(2 / (fan_in + fan_out)) with the
    TensorSpec's fans, fan_in = embedding_dim and fan_out = num_embeddings (a std of
    embedding_dim**-0.5 would need a per-tensor constant; Xavier-normal is the documented
    choice here). Norms 1/0, biases 0.
    """
    return [
        *_norms_and_biases(),
        Rule(Match(kinds=("embedding",), params=("weight",)), Distribution("xavier_normal", gain=1.0), name="embedding xavier_normal"),
        Rule(_MATRICES, Distribution("xavier_uniform", gain=1.0), name="linear xavier_uniform"),
    ]


def _lecun_normal(model: ModelSpec) -> list[Rule]:
    """LeCun normal = ``torch.nn.init.kaiming_normal_(w, mode="fan_in", nonlinearity="linear")``.

    Every Linear and Embedding weight ~ N(0, 1 / sqrt(fan_in)) (gain 1 for "linear"); fan_in is
    the TensorSpec's (in_features of a Linear, embedding_dim of an Embedding). Norms 1/0,
    biases 0. Sources: LeCun et al. 1998 "Efficient BackProp"; He et al. 2015. (Named
    ``kaiming`` before; the same bytes.)
    """
    return [
        *_norms_and_biases(),
        Rule(_WEIGHTS, Distribution("kaiming_normal", mode="fan_in", nonlinearity="linear"), name="lecun_normal"),
    ]


def _kaiming(model: ModelSpec) -> list[Rule]:
    """He et al. 2015, as ``torch.nn.init.kaiming_normal_(w)`` does by default: mode ``fan_in``,
    nonlinearity ``leaky_relu`` with negative_slope 0, so gain sqrt(2).

    Every Linear and Embedding weight ~ N(0, sqrt(2 / fan_in)); fan_in is the TensorSpec's
    (in_features of a Linear, embedding_dim of an Embedding). Norms 1/0, biases 0.
    Source: He et al. 2015 "Delving Deep into Rectifiers"; ``torch.nn.init.kaiming_normal_``.
    """
    he = Distribution("kaiming_normal", mode="fan_in", nonlinearity="leaky_relu", negative_slope=0.0)
    return [*_norms_and_biases(), Rule(_WEIGHTS, he, name="kaiming_normal")]


def _small_init(model: ModelSpec) -> list[Rule]:
    """SmallInit (Nguyen & Salazar 2019, "Transformers without Tears"): every Linear and
    Embedding weight ~ N(0, sqrt(2 / (5 * d))), d = ``model.hidden_size``; norms 1/0, biases 0."""
    std = math.sqrt(2.0 / (5.0 * model.hidden_size))
    return [*_norms_and_biases(), Rule(_WEIGHTS, Distribution("normal", std=std), name="small init")]


def _torch_trunc_normal(model: ModelSpec) -> list[Rule]:
    """What ``torch.nn.init.trunc_normal_(w, std=initializer_range)`` does: a=-2, b=2 are
    *absolute* values, i.e. +-100 sigma at std 0.02, so effectively no truncation (effective
    std = initializer_range). Every Linear and Embedding weight; norms 1/0, biases 0."""
    trunc = Distribution("trunc_normal", std=model.initializer_range, a=-2.0, b=2.0, bounds="absolute")
    return [*_norms_and_biases(), Rule(_WEIGHTS, trunc, name="weight")]


PRESETS = {
    "hf-default": _hf_default,
    "bert-tf": _bert_tf,
    "gpt2": _gpt2,
    "megatron": _megatron,
    "torchtitan-llama3": _torchtitan_llama3,
    "xavier": _xavier,
    "kaiming": _kaiming,
    "lecun-normal": _lecun_normal,
    "small-init": _small_init,
    "torch-trunc-normal": _torch_trunc_normal,
}
