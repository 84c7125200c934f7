"""Init policies as data: ordered rules that match tensors and give them a distribution.

A policy resolves every tensor of a model to exactly one engine :class:`Sampler`; a tensor that
no rule matches is an error that names it (never a silent default). Presets are ordinary rule
lists built from the model (they need its ``initializer_range`` and depth).
"""
from __future__ import annotations

import dataclasses
import decimal
import fnmatch
import math
import re
from dataclasses import dataclass

from ..engine import Sampler, std_normal_cdf
from ..engine.sampler import MIN_TRUNC_MASS
from .quoting import quote
from .tensors import KINDS, PARAMS, ROLES, ModelSpec, TensorSpec

DISTRIBUTIONS = (
    "normal",
    "trunc_normal",
    "uniform",
    "constant",
    "xavier_uniform",
    "xavier_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "recorded",
)
DEPTH_SCALINGS = ("none", "n_layers", "layer")
_NONLINEARITY_GAIN = {"linear": 1.0, "sigmoid": 1.0, "relu": math.sqrt(2.0), "tanh": 5.0 / 3.0, "selu": 0.75}
#: Most values in one of a Match's lists (kinds, roles, params, names).
MAX_MATCH_VALUES = 256
#: Longest ``names`` glob (tensor names are far shorter).
MAX_GLOB_CHARS = 1024
#: Longest rule name.
MAX_RULE_NAME_CHARS = 200


@dataclass(frozen=True)
class Match:
    """Selects tensors: every non-empty field must match; within a field any value may."""

    kinds: tuple[str, ...] = ()
    """Module kinds (``linear``, ``embedding``, ``norm``); empty: any."""
    roles: tuple[str, ...] = ()
    """Roles (see :data:`modelinit_server.core.tensors.ROLES`); empty: any."""
    params: tuple[str, ...] = ()
    """``weight`` / ``bias``; empty: any."""
    names: tuple[str, ...] = ()
    """fnmatch globs on the tensor name (``*`` crosses dots); empty: any."""
    min_layer: int | None = None
    """Lowest block index matched (inclusive); tensors outside blocks never match a layer range."""
    max_layer: int | None = None
    """Highest block index matched (inclusive)."""

    def __post_init__(self) -> None:
        for label, values in (("kinds", self.kinds), ("roles", self.roles), ("params", self.params), ("names", self.names)):
            if len(values) > MAX_MATCH_VALUES:
                raise ValueError(f"match.{label}: {len(values)} values, more than {MAX_MATCH_VALUES}; split the rule")
        for label, values, allowed in (("kinds", self.kinds, KINDS), ("roles", self.roles, ROLES), ("params", self.params, PARAMS)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"match.{label}: unknown {quote(bad[0])}; use one of: {', '.join(allowed)}")
        for i, glob in enumerate(self.names):
            if not isinstance(glob, str):
                raise ValueError(f"match.names[{i}]: must be a glob (a string), got {quote(glob)}")
            if len(glob) > MAX_GLOB_CHARS:
                raise ValueError(f"match.names[{i}]: a glob of {len(glob):,} characters ({quote(glob)}), "
                                 f"longer than {MAX_GLOB_CHARS}; tensor names are far shorter")
        if self.min_layer is not None and self.max_layer is not None and self.min_layer > self.max_layer:
            raise ValueError(f"match.min_layer: {self.min_layer} is above max_layer {self.max_layer}")
        # Compiled here, held by this Match: fnmatch's own pattern cache (32,768 entries) would
        # keep every request's globs alive in the server; re's cache is bounded (512 patterns).
        object.__setattr__(self, "_globs", tuple(re.compile(fnmatch.translate(g)).match for g in self.names))

    def selects(self, t: TensorSpec) -> bool:
        if self.kinds and t.kind not in self.kinds:
            return False
        if self.roles and t.role not in self.roles:
            return False
        if self.params and t.param not in self.params:
            return False
        if self.names and not any(match(t.name) for match in self._globs):  # fnmatch.fnmatchcase
            return False
        if self.min_layer is not None or self.max_layer is not None:
            if t.layer is None:
                return False
            if self.min_layer is not None and t.layer < self.min_layer:
                return False
            if self.max_layer is not None and t.layer > self.max_layer:
                return False
        return True


@dataclass(frozen=True)
class Distribution:
    """A distribution before it meets a tensor (fan-based kinds need the tensor's fans).

    Formulas (fan = fan_in, fan_out, or their mean for Xavier):
    ``xavier_normal``: std = gain * sqrt(2 / (fan_in + fan_out));
    ``xavier_uniform``: bound = gain * sqrt(6 / (fan_in + fan_out));
    ``kaiming_normal``: std = g / sqrt(fan); ``kaiming_uniform``: bound = g * sqrt(3 / fan), with
    g = torch's ``calculate_gain(nonlinearity, negative_slope)``.
    """

    kind: str
    """One of :data:`DISTRIBUTIONS`. ``recorded``: the tensor's own transformers rule
    (``TensorSpec.hf_init``, learned from the model class; see docs/policies.md)."""
    mean: float = 0.0
    """normal / trunc_normal mean."""
    std: float = 0.0
    """normal / trunc_normal std (of the untruncated normal unless ``preserve_std``)."""
    a: float = -2.0
    """trunc_normal lower bound (sigma units or absolute, see ``bounds``)."""
    b: float = 2.0
    """trunc_normal upper bound."""
    bounds: str = "sigma"
    """``sigma``: a, b in std units around the mean (TF); ``absolute``: values (torch)."""
    preserve_std: bool = False
    """trunc_normal: divide std by the truncation's std factor so the result has std ``std``."""
    low: float = 0.0
    """uniform lower bound."""
    high: float = 0.0
    """uniform upper bound."""
    value: float = 0.0
    """constant value."""
    gain: float = 1.0
    """Xavier gain."""
    negative_slope: float = 0.0
    """Kaiming leaky-ReLU slope."""
    mode: str = "fan_in"
    """Kaiming fan: ``fan_in`` or ``fan_out``."""
    nonlinearity: str = "leaky_relu"
    """Kaiming nonlinearity (torch's default for kaiming_* is ``leaky_relu`` with slope 0)."""

    def __post_init__(self) -> None:
        k = self.kind
        if k not in DISTRIBUTIONS:
            raise ValueError(f"init: unknown distribution {k!r}; use one of: {', '.join(DISTRIBUTIONS)}")
        for fname in ("mean", "std", "a", "b", "low", "high", "value", "gain", "negative_slope"):
            v = getattr(self, fname)
            if math.isnan(v) or (math.isinf(v) and fname not in ("a", "b")):
                raise ValueError(f"init.{k}.{fname}: must be a finite number, got {v}")
        if k in ("normal", "trunc_normal") and not self.std > 0:
            raise ValueError(f"init.{k}.std: must be > 0, got {self.std}")
        if k == "trunc_normal":
            if self.bounds not in ("sigma", "absolute"):
                raise ValueError(f"init.trunc_normal.bounds: {quote(self.bounds)} is not 'sigma' or 'absolute'")
            if not self.a < self.b:
                raise ValueError(f"init.trunc_normal: lower bound a={self.a} must be below b={self.b}")
            if self.preserve_std and self.bounds != "sigma":
                raise ValueError("init.trunc_normal.preserve_std: needs bounds='sigma' (absolute bounds move with the std)")
            if self.bounds == "sigma":
                _check_trunc_mass(self.a, self.b, f"a={self.a:g}, b={self.b:g}")
            else:  # at this std; a rule's depth scaling may shrink it further (checked per tensor)
                _check_trunc_mass((self.a - self.mean) / self.std, (self.b - self.mean) / self.std,
                                  f"a={self.a:g}, b={self.b:g} (absolute, mean {self.mean:g}, std {self.std:g})")
        if k == "uniform" and not self.low < self.high:
            raise ValueError(f"init.uniform: low={self.low} must be below high={self.high}")
        if k == "uniform" and not math.isfinite(self.high - self.low):
            raise ValueError(f"init.uniform: high - low = {self.high:g} - {self.low:g} overflows a double; use a narrower range")
        if k.startswith("xavier") and not self.gain > 0:
            raise ValueError(f"init.{k}.gain: must be > 0, got {self.gain}")
        if k.startswith("kaiming"):
            if self.mode not in ("fan_in", "fan_out"):
                raise ValueError(f"init.{k}.mode: {quote(self.mode)} is not 'fan_in' or 'fan_out'")
            if self.nonlinearity not in (*_NONLINEARITY_GAIN, "leaky_relu"):
                raise ValueError(
                    f"init.{k}.nonlinearity: unknown {quote(self.nonlinearity)}; use one of: "
                    f"{', '.join([*_NONLINEARITY_GAIN, 'leaky_relu'])}"
                )
            try:
                _kaiming_gain(self)
            except OverflowError:
                raise ValueError(
                    f"init.{k}.negative_slope: {self.negative_slope:g} is too large: its square overflows the gain "
                    "sqrt(2 / (1 + negative_slope^2)); use a slope below 1e150 in magnitude"
                ) from None


@dataclass(frozen=True)
class Rule:
    """One policy rule: which tensors, which distribution, which modifiers."""

    match: Match
    """Tensors this rule selects."""
    init: Distribution
    """Their distribution."""
    depth_scaling: str = "none"
    """``none``; ``n_layers``: std / sqrt(2 * n_layers) (GPT-2, Megatron); ``layer``: std / sqrt(2 * (layer + 1)) (torchtitan)."""
    zero_padding_row: bool = False
    """Zero the embedding's padding row (HF ``padding_idx``)."""
    name: str = ""
    """Shown in plans and errors; empty: ``rule[<index>]``."""

    def __post_init__(self) -> None:
        if len(self.name) > MAX_RULE_NAME_CHARS:
            raise ValueError(f"name: {len(self.name):,} characters ({quote(self.name)}), longer than {MAX_RULE_NAME_CHARS}")
        if self.depth_scaling not in DEPTH_SCALINGS:
            raise ValueError(f"rule {self.name!r}: depth_scaling {self.depth_scaling!r} is not one of {', '.join(DEPTH_SCALINGS)}")
        if self.depth_scaling != "none" and self.init.kind in ("constant", "recorded"):
            raise ValueError(f"rule {self.name!r}: depth_scaling does not apply to a constant")


@dataclass(frozen=True)
class Policy:
    """A preset (optional) and rules of one's own, tried before the preset's."""

    preset: str = ""
    """Preset name (see :data:`PRESETS`); empty with no rules means ``hf-default``."""
    rules: tuple[Rule, ...] = ()
    """Rules tried first, in order."""

    def __post_init__(self) -> None:
        if self.preset and self.preset not in PRESETS:
            raise ValueError(f"policy.preset: unknown preset {quote(self.preset)}; use one of: {', '.join(PRESETS)}")

    @property
    def effective_preset(self) -> str:
        return self.preset or ("" if self.rules else "hf-default")


@dataclass(frozen=True)
class Resolved:
    """A tensor's resolved init: the sampler the engine runs and what the plan reports."""

    sampler: Sampler
    rule: str
    """Name of the rule that matched."""
    init: str
    """Human-readable distribution, e.g. ``normal(mean=0, std=0.02)``."""
    std: float
    """Std of the (untruncated) distribution sampled; 0 for constants."""
    effective_std: float
    """Analytic std of the values (truncation included)."""
    formula: str = ""
    """How the std (or bound) follows from the rule and the tensor, with its numbers, e.g.
    ``kaiming_normal: std = gain/sqrt(fan_in) = sqrt(2)/sqrt(768) (gain of leaky_relu, negative_slope 0)``."""


# --- presets -----------------------------------------------------------------------------

_ONES = Distribution("constant", value=1.0)
_ZEROS = Distribution("constant", value=0.0)


def _norms_and_biases() -> list[Rule]:
    return [
        Rule(Match(kinds=("norm",), params=("weight",)), _ONES, name="norm weight = 1"),
        Rule(Match(params=("bias",)), _ZEROS, name="bias = 0"),
    ]


#: Every tensor's own recorded transformers rule (generic specs).
_RECORDED = Distribution("recorded")


def _recorded(model: ModelSpec) -> bool:
    return any(t.hf_init is not None for t in model.tensors)


def _hf_default(model: ModelSpec) -> list[Rule]:
    """What transformers' ``_init_weights`` does for the family (see docs/policies.md): the rule
    recorded from the model class itself, or for the built-in families the same rules written out."""
    if _recorded(model):
        return [Rule(Match(), _RECORDED, name="hf-default")]
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


# --- resolution -------------------------------------------------------------------------------


#: Presets other than hf-default leave tensors of kind ``other`` (ViT's cls_token, bare position
#: tables) to their recorded transformers rule, by this named rule, listed last.
_OTHER_RECORDED = Rule(Match(kinds=("other",)), _RECORDED, name="other: hf-default")


def rules_for(policy: Policy, model: ModelSpec) -> list[Rule]:
    """The full ordered rule list: the policy's own, then its preset's."""
    rules = list(policy.rules)
    if policy.effective_preset:
        rules += PRESETS[policy.effective_preset](model)
        if policy.effective_preset != "hf-default" and _recorded(model):
            rules.append(_OTHER_RECORDED)
    return [r if r.name else Rule(r.match, r.init, r.depth_scaling, r.zero_padding_row, f"rule[{i}]") for i, r in enumerate(rules)]


def resolve(policy: Policy, model: ModelSpec) -> list[Resolved]:
    """Resolve every tensor of ``model`` (in order) to its sampler; ValueError names an unmatched tensor."""
    rules = rules_for(policy, model)
    out = []
    for t in model.tensors:
        rule = next((r for r in rules if r.match.selects(t)), None)
        if rule is None:
            raise ValueError(
                f"policy: no rule matches tensor {t.name!r} (kind={t.kind}, role={t.role}, param={t.param}); "
                "add a rule that selects it or use a preset such as 'hf-default'"
            )
        out.append(_resolve_one(rule, t, model))
    return out


def _depth_divisor(rule: Rule, t: TensorSpec, model: ModelSpec) -> float:
    if rule.depth_scaling == "n_layers":
        return math.sqrt(2.0 * model.n_layers)
    if rule.depth_scaling == "layer":
        if t.layer is None:
            raise ValueError(f"rule {rule.name!r}: depth_scaling 'layer' matched {t.name!r}, which is outside the blocks")
        return math.sqrt(2.0 * (t.layer + 1))
    return 1.0


def _kaiming_gain(d: Distribution) -> float:
    if d.nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1.0 + d.negative_slope**2))
    return _NONLINEARITY_GAIN[d.nonlinearity]


def _fans(rule: Rule, t: TensorSpec) -> tuple[int, int]:
    if t.fan_in <= 0 or t.fan_out <= 0:
        raise ValueError(f"rule {rule.name!r}: {rule.init.kind} needs fan_in/fan_out, which {t.name!r} lacks")
    return t.fan_in, t.fan_out


def _from_recorded(rule: Rule, t: TensorSpec) -> Rule:
    """The rule transformers applies to ``t``, as recorded (a ``recorded`` rule resolved for one tensor)."""
    h = t.hf_init
    if h is None:
        raise ValueError(
            f"rule {rule.name!r}: tensor {t.name!r} has no recorded transformers rule (built-in families write "
            "hf-default out as rules); give it a distribution of its own"
        )
    if h.kind == "normal":
        d = Distribution("normal", mean=h.mean, std=h.std)
    elif h.kind == "trunc_normal":
        d = Distribution("trunc_normal", mean=h.mean, std=h.std, a=h.a, b=h.b, bounds="absolute")
    elif h.kind == "uniform":
        d = Distribution("uniform", low=h.low, high=h.high)
    else:
        d = Distribution("constant", value=h.value)
    name = rule.name if rule.name != "hf-default" else f"hf-default: {h.source}"
    return Rule(rule.match, d, zero_padding_row=h.zero_row, name=name)


def _resolve_one(rule: Rule, t: TensorSpec, model: ModelSpec) -> Resolved:
    if rule.init.kind == "recorded":
        rule = _from_recorded(rule, t)
    return dataclasses.replace(_sampled(rule, t, model), formula=formula(rule, t, model))


_GAIN_TEXT = {"linear": "1", "sigmoid": "1", "relu": "sqrt(2)", "tanh": "5/3", "selu": "3/4"}


def formula(rule: Rule, t: TensorSpec, model: ModelSpec) -> str:
    """The formula of ``rule``'s std (or bounds) for tensor ``t``, with the numbers put in:
    what ``explain`` shows beside each group (``rule`` already resolved from ``recorded``)."""
    d, kind = rule.init, rule.init.kind
    if rule.depth_scaling == "n_layers":
        depth = ("/sqrt(2·n_layers)", f"/sqrt(2·{model.n_layers})")
    elif rule.depth_scaling == "layer" and t.layer is not None:
        depth = ("/sqrt(2·(layer+1))", f"/sqrt(2·{t.layer + 1})")
    else:
        depth = ("", "")

    def wrap(x: str) -> str:
        return f"({x})" if any(c in x for c in "/·") else x

    def scaled(name: str, symbolic: str, numeric: str) -> str:
        if depth[0]:
            symbolic, numeric = wrap(symbolic) + depth[0], wrap(numeric) + depth[1]
        return f"{kind}: {name} = {symbolic}" + (f" = {numeric}" if numeric != symbolic else "")

    if kind == "constant":
        return f"constant: value = {d.value:g}"
    if kind == "normal":
        return scaled("std", f"{d.std:g}", f"{d.std:g}")
    if kind == "uniform":
        return scaled("[low, high]", f"[{d.low:g}, {d.high:g}]", f"[{d.low:g}, {d.high:g}]")
    if kind == "trunc_normal":
        std = d.std / _depth_divisor(rule, t, model)
        if d.bounds == "sigma":
            a, b = d.a, d.b
            bounds = f"a={a:g}σ, b={b:g}σ"
        else:
            a, b = (d.a - d.mean) / std, (d.b - d.mean) / std
            bounds = f"a={d.a:g}, b={d.b:g} absolute (a={a:.6g}σ, b={b:.6g}σ)"
        factor = truncated_std_factor(a, b)
        out = scaled("std", f"{d.std:g}", f"{d.std:g}") + f", {bounds}"
        return out + (f", std/{factor:.6g} (preserve_std)" if d.preserve_std else f", eff. std = std·{factor:.6g}")
    if t.fan_in <= 0 or t.fan_out <= 0:
        return f"{kind}: needs fan_in/fan_out"
    if kind.startswith("xavier"):
        n = 2 if kind == "xavier_normal" else 6
        name = "std" if kind == "xavier_normal" else "bound"
        return scaled(name, f"gain·sqrt({n}/(fan_in+fan_out))", f"{d.gain:g}·sqrt({n}/({t.fan_in}+{t.fan_out}))")
    # kaiming
    if d.nonlinearity == "leaky_relu":
        gain = "sqrt(2)" if d.negative_slope == 0 else f"sqrt(2/(1+{d.negative_slope:g}²))"
        act = f"leaky_relu, negative_slope {d.negative_slope:g}"
    else:
        gain, act = _GAIN_TEXT.get(d.nonlinearity, "?"), d.nonlinearity
    fan = d.mode
    fan_value = t.fan_in if fan == "fan_in" else t.fan_out
    if kind == "kaiming_normal":
        out = scaled("std", f"gain/sqrt({fan})", f"{gain}/sqrt({fan_value})")
    else:
        out = scaled("bound", f"gain·sqrt(3/{fan})", f"{gain}·sqrt(3/{fan_value})")
    return f"{out} (gain of {act})"


def _sampled(rule: Rule, t: TensorSpec, model: ModelSpec) -> Resolved:
    d = rule.init
    div = _depth_divisor(rule, t, model)
    zero_row = t.padding_idx if rule.zero_padding_row else None
    row = {"zero_row": zero_row, "row_size": t.numel // t.shape[0] if t.shape else 1}
    kind = d.kind
    if kind == "constant":
        return Resolved(Sampler("constant", value=d.value, **row), rule.name, f"constant({d.value:g})", 0.0, 0.0)

    # Fan-based kinds reduce to normal / uniform with a computed std or bound.
    if kind.startswith(("xavier", "kaiming")):
        fan_in, fan_out = _fans(rule, t)
        if kind.startswith("xavier"):
            std = d.gain * math.sqrt(2.0 / (fan_in + fan_out))
        else:
            std = _kaiming_gain(d) / math.sqrt(fan_in if d.mode == "fan_in" else fan_out)
        std /= div
        if kind.endswith("normal"):
            return Resolved(Sampler("normal", std=std, **row), rule.name, f"{kind} -> normal(mean=0, std={std:.6g})", std, std)
        bound = math.sqrt(3.0) * std
        return Resolved(
            Sampler("uniform", low=-bound, high=bound, **row), rule.name, f"{kind} -> uniform({-bound:.6g}, {bound:.6g})", std, std
        )

    if kind == "uniform":
        low, high = d.low / div, d.high / div
        std = (high - low) / math.sqrt(12.0)
        return Resolved(Sampler("uniform", low=low, high=high, **row), rule.name, f"uniform({low:.6g}, {high:.6g})", std, std)

    std = d.std / div
    if kind == "normal":
        return Resolved(
            Sampler("normal", mean=d.mean, std=std, **row), rule.name, f"normal(mean={d.mean:g}, std={std:.6g})", std, std
        )

    # trunc_normal
    if d.bounds == "sigma":
        a, b = d.a, d.b
    else:
        a, b = (d.a - d.mean) / std, (d.b - d.mean) / std
        try:  # the depth-scaled std may push absolute bounds into a tail
            _check_trunc_mass(a, b, f"a={d.a:g}, b={d.b:g} (absolute, mean {d.mean:g}, std {std:.3g} at {t.name!r})")
        except ValueError as e:
            raise ValueError(f"rule {rule.name!r}: {e}") from None
    factor = truncated_std_factor(a, b)
    if d.preserve_std:
        if not factor > 0:
            raise ValueError(f"rule {rule.name!r}: init.trunc_normal.preserve_std: the interval a={a:g}, b={b:g} is too "
                             "narrow to compute its std in double precision; widen it or drop preserve_std")
        std /= factor
    desc = f"trunc_normal(mean={d.mean:g}, std={std:.6g}, a={a:g}σ, b={b:g}σ)"
    return Resolved(Sampler("trunc_normal", mean=d.mean, std=std, a=a, b=b, **row), rule.name, desc, std, std * factor)


def _check_trunc_mass(a: float, b: float, shown: str) -> None:
    """ValueError unless N(0, 1) has at least MIN_TRUNC_MASS between ``a`` and ``b`` (sigma
    units), computed as the sampler computes it (the sampler refuses less)."""
    try:
        Sampler("trunc_normal", a=a, b=b)
    except ValueError:
        raise ValueError(
            f"init.trunc_normal: bounds {shown} hold no probability mass ({a:.4g}σ to {b:.4g}σ from the mean: less "
            f"than {MIN_TRUNC_MASS:g} of the normal lies between them); use bounds nearer the mean"
        ) from None


def truncated_std_factor(a: float, b: float) -> float:
    """Std of N(0, 1) truncated to [a, b] (a, b may be infinite):
    sqrt(1 + (a phi(a) - b phi(b)) / Z - ((phi(a) - phi(b)) / Z)^2), Z = Phi(b) - Phi(a).

    Uses no libm function (Phi and phi come correctly rounded from ``decimal``, the rest is
    IEEE arithmetic): with ``preserve_std`` the sampled std depends on it, so it must give the
    same double on every platform.
    """
    z = std_normal_cdf(b) - std_normal_cdf(a)
    pa, pb = _std_normal_pdf(a), _std_normal_pdf(b)
    xpa = 0.0 if math.isinf(a) else a * pa
    xpb = 0.0 if math.isinf(b) else b * pb
    m = (pa - pb) / z
    var = 1.0 + (xpa - xpb) / z - m * m
    return math.sqrt(max(var, 0.0))


_TWO_PI = decimal.Decimal("6.28318530717958647692528676655900576839433879875021164194989")


def _std_normal_pdf(x: float) -> float:
    """exp(-x^2 / 2) / sqrt(2 pi), correctly rounded (decimal, 40 digits)."""
    if math.isinf(x):
        return 0.0
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        d = decimal.Decimal(x)
        return float((-(d * d) / 2).exp() / _TWO_PI.sqrt())
