"""The named presets (:data:`PRESETS`): rule lists built from the model (its ``initializer_range``,
depth, hidden size), one function per preset, each documenting its source.

``hf-default`` is what transformers' ``_init_weights`` does: the rule recorded from the model
class (``Distribution("recorded")``) or, for the built-in families, the same rules written out.
"""
from __future__ import annotations

import glob
import math

from modelinit_wire.constants import MUP_BASE_WIDTH

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
    - norms 1, biases 0. A tied ``lm_head`` is stored as the token embedding, which then gets the
      output's law, as in torchtitan's tied flavors (Llama 3.2 1B/3B: the embedding's own init is
      skipped, and ``Decoder.init_states`` ties it to the output before the output's init runs).

    Source: torchtitan ``models/llama3/__init__.py`` (0.3.0: ``_LINEAR_INIT``, ``_depth_init``,
    ``_output_linear_init``, ``_EMBEDDING_SKIP_INIT``) and ``models/common/decoder.py``.
    """
    trunc = Distribution("trunc_normal", std=0.02, a=-2.0, b=2.0, bounds="absolute")
    final_std = model.hidden_size**-0.5
    final = Distribution("trunc_normal", std=final_std, a=-3.0, b=3.0, bounds="sigma")
    head_stored = any(t.role == "lm_head" and t.param == "weight" for t in model.tensors)
    tied = set(model.tied.values())
    as_head = [] if head_stored else [glob.escape(t.name) for t in model.tensors
                                      if t.role == "token_embedding" and t.param == "weight" and t.name in tied]
    return [
        *_norms_and_biases(),
        *([Rule(Match(kinds=("embedding",), names=tuple(as_head)), final, name="output (tied to the embedding)")]
          if as_head else []),
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


def _olmo2(model: ModelSpec) -> list[Rule]:
    """OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", arXiv:2501.00656, sec. 3.2.1): every parameter of
    the Linear and Embedding layers (the output layer included) ~ N(0, 0.02) truncated at +-3 sigma;
    norms 1, biases 0. Reference code: OLMo-core ``olmo_core/nn/transformer/init.py``
    (``InitMethod.normal``, ``init_linear``: ``trunc_normal_(std=0.02, a=-3*std, b=3*std)``).
    The std is the paper's 0.02, not the config's ``initializer_range``."""
    trunc = Distribution("trunc_normal", std=0.02, a=-3.0, b=3.0, bounds="sigma")
    return [*_norms_and_biases(), Rule(_WEIGHTS, trunc, name="weight (trunc +-3 sigma)")]


def _gpt_neox(model: ModelSpec) -> list[Rule]:
    """GPT-NeoX's ``small_init`` for every weight and ``wang_init`` for the residual output
    projections (its 20B configuration: ``init_method: small_init``, ``output_layer_init_method:
    wang_init``). d = ``hidden_size``, L = ``n_layers``:

    - ``small_init``: N(0, sqrt(2 / (5 d))) (Nguyen & Salazar 2019, "Transformers without Tears");
    - ``wang_init``: N(0, 2 / (L sqrt(d))) for ``attn_out`` and ``mlp_out`` (Wang & Komatsuzaki, Mesh
      Transformer JAX / GPT-J);
    - norms 1, biases 0. Reference code: gpt-neox ``megatron/model/init_functions.py``
      (``small_init_init_method``, ``wang_init_method``)."""
    d, layers = model.hidden_size, max(model.n_layers, 1)
    small = Distribution("normal", std=math.sqrt(2.0 / (5.0 * d)))
    wang = Distribution("normal", std=2.0 / (layers * math.sqrt(d)))
    return [
        *_norms_and_biases(),
        Rule(_RESIDUAL_OUT, wang, name="wang_init (output projections)"),
        Rule(_WEIGHTS, small, name="small_init"),
    ]


#: Tensor names of value and query projections across families (fused qkv matches neither).
_VALUE = ("*.v_proj.weight", "*.value.weight", "*.v.weight", "*.wv.weight", "*.v_proj.*.weight")
_QUERY = ("*.q_proj.weight", "*.query.weight", "*.q.weight", "*.wq.weight")


def deepnet_betas(model: ModelSpec) -> tuple[str, dict[str, float], dict[str, float]]:
    """DeepNet's (kind, {stack: alpha}, {stack: beta}) for ``model`` (Wang et al. 2022, Table 1):
    encoder-only (N layers) alpha = (2N)^(1/4), beta = (8N)^(-1/4); decoder-only (M) alpha =
    (2M)^(1/4), beta = (8M)^(-1/4); encoder-decoder: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87
    (N^4 M)^(-1/16), decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4)."""
    def layers_of(stack: str) -> set[int]:
        return {t.layer for t in model.tensors if t.layer is not None and f"{stack}." in f".{t.name}"}

    encoder, decoder = layers_of("encoder"), layers_of("decoder")
    if encoder and decoder:  # N and M from the layers the tensors belong to (any family's config keys)
        n, m = len(encoder), len(decoder)
        return ("encoder-decoder", {"encoder": 0.81 * (n**4 * m) ** (1 / 16), "decoder": (3 * m) ** 0.25},
                {"encoder": 0.87 * (n**4 * m) ** (-1 / 16), "decoder": (12 * m) ** -0.25})
    layers = max(model.n_layers, 1)
    causal = model.architecture.endswith(("ForCausalLM", "LMHeadModel")) or bool(model.config.get("is_decoder"))
    kind = "decoder-only" if causal else "encoder-only"
    return kind, {"": (2 * layers) ** 0.25}, {"": (8 * layers) ** -0.25}


def _deepnet(model: ModelSpec) -> list[Rule]:
    """DeepNet / DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers",
    arXiv:2203.00555, Table 1 and Algorithm 1): Xavier-normal with gain beta for the value, attention
    output and both feed-forward projections, gain 1 for query and key; embeddings and the output
    layer N(0, d^-0.5) (torchscale); norms 1, biases 0. beta from the depth (:func:`deepnet_betas`).

    Only half of DeepNorm lives in the weights: its residual is x_{l+1} = LN(alpha x_l + G(x_l)),
    a forward-time multiplier alpha the weights cannot carry; this preset gives the init DeepNorm
    prescribes, and without alpha in the model's forward pass it is not DeepNet. A fused qkv
    projection cannot tell v from q and k: it gets gain 1. Reference code: microsoft/torchscale
    (``deepnorm`` init in ``torchscale/architecture/encoder.py`` / ``decoder.py``)."""
    _, _, betas = deepnet_betas(model)
    embed = Distribution("normal", std=model.hidden_size**-0.5)
    rules = [*_norms_and_biases(),
             Rule(Match(kinds=("embedding",), params=("weight",)), embed, name="embedding N(0, d^-0.5)"),
             Rule(Match(kinds=("linear",), roles=("lm_head",), params=("weight",)), embed, name="output N(0, d^-0.5)")]
    for stack, beta in betas.items():
        prefix = (f"*{stack}.*",) if stack else ("*",)
        scaled = Distribution("xavier_normal", gain=beta)

        def within(globs: tuple[str, ...], stack=stack) -> tuple[str, ...]:
            return tuple(f"*{stack}.*{g.lstrip('*')}" for g in globs) if stack else globs

        rules += [
            Rule(Match(kinds=("linear", "expert"), params=("weight",), names=within(_VALUE)), scaled,
                 name=f"{stack + ' ' if stack else ''}v_proj xavier_normal(gain beta={beta:.4g})"),
            Rule(Match(kinds=("linear", "expert"), roles=("attn_out", "mlp_in", "mlp_out"), params=("weight",), names=prefix),
                 scaled, name=f"{stack + ' ' if stack else ''}out/ffn xavier_normal(gain beta={beta:.4g})"),
        ]
    rules.append(Rule(_MATRICES, Distribution("xavier_normal", gain=1.0), name="q/k and others xavier_normal(gain 1)"))
    return rules




def _mup(model: ModelSpec) -> list[Rule]:
    """µP (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466, Table 3 and sec. 6) as the
    ``mup`` package initializes with ``mup.init.normal_(w, std=sigma)`` after ``set_base_shapes``, at
    a base width of :data:`MUP_BASE_WIDTH`, sigma = ``initializer_range``:

    - hidden matrices (both dimensions grow with width: q/k/v, attention output, MLP in and out,
      experts) ~ N(0, sigma·sqrt(base / hidden_size)) (mup: std · width_mult^-1/2);
    - vector-like weights (one dimension grows: embeddings, routers) ~ N(0, sigma);
    - the readout (``lm_head``) and the query projection: 0, as the paper recommends;
    - norms 1, biases 0.

    The rest of µP is not in the weights: the readout's output multiplier 1/width_mult, attention
    logits scaled by 1/d_head instead of 1/sqrt(d_head), and per-parameter learning rates (Adam:
    hidden lr / width_mult). A model trained with this init but without those is not µP.
    Reference code: microsoft/mup (``mup/init.py``: ``constant_std_init_``)."""
    sigma = model.initializer_range
    hidden = Distribution("normal", std=sigma * math.sqrt(MUP_BASE_WIDTH / model.hidden_size))
    return [
        *_norms_and_biases(),
        Rule(Match(kinds=("linear",), roles=("lm_head",), params=("weight",)), _ZEROS, name="readout zero"),
        Rule(Match(kinds=("linear",), params=("weight",), names=_QUERY), _ZEROS, name="query zero"),
        Rule(Match(kinds=("embedding", "router"), params=("weight",)), Distribution("normal", std=sigma),
             name="vector-like N(0, sigma)"),
        Rule(_MATRICES, hidden, name=f"hidden N(0, sigma·sqrt({MUP_BASE_WIDTH}/{model.hidden_size}))"),
    ]


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
    "olmo2": _olmo2,
    "gpt-neox": _gpt_neox,
    "deepnet": _deepnet,
    "mup": _mup,
}
