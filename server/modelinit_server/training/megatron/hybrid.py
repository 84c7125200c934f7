"""Megatron-Core's ``HybridModel`` (0.19's successor to ``GPTModel``, ``megatron.core.models.hybrid``):
one layer per symbol of its ``hybrid_layer_pattern``, and which Hugging Face layer each one is.

A pattern's symbols (Megatron's ``hybrid_layer_allocation.Symbols``): ``*`` attention, ``-`` MLP,
``E`` MoE, ``M`` Mamba, ``G`` gated delta net, ``+`` MLA, ``D`` DeepSeek sparse attention; ``|``
separates pipeline stages and ``/`` starts the multi-token prediction layers. Megatron's own
migration from GPTModel pairs the weights by position: a GPT layer is ``*-`` (or ``*E``), so
Hugging Face layer ``i``'s attention is the pattern's ``i``-th ``*`` and its MLP the ``-`` or ``E``
right after it. That is the only mapping made: a pattern of attention-then-MLP pairs is a Llama-
style family's model (the families :mod:`.config` derives), filled as the GPTModel of the same
layers is. Every other symbol is refused by name before anything is written: Mamba (``M``) and
gated delta net (``G``) layers need ``mamba_ssm``/``fla`` and CUDA to be built at all, so their
layout is unverified; MLA and DSA are not mapped in a hybrid model.

Megatron saves each layer under its global symbol index (``HybridStack.sharded_state_dict``:
``decoder.layers.<i + the earlier stages' symbols>.``), which :func:`hf_layer_of` turns into the
Hugging Face layer."""
from __future__ import annotations

from dataclasses import dataclass

#: Symbols with a Hugging Face counterpart: attention, then an MLP (dense or MoE).
ATTENTION, MLP, MOE = "*", "-", "E"
#: The others, each with why it is refused.
_REFUSED = {"M": "a Mamba layer (MambaLayer needs mamba_ssm and CUDA: never built or verified here)",
            "G": "a gated delta net layer (needs fla and CUDA: never built or verified here)",
            "+": "a multi-latent attention layer (mapped in GPTModel, not yet in a hybrid model)",
            "D": "a DeepSeek sparse attention layer (its indexer has no Hugging Face counterpart modelinit writes)"}


def is_hybrid_model(model) -> bool:
    """Whether ``model`` is Megatron-Core's HybridModel (or MambaModel, its deprecated subclass)."""
    return any(c.__name__ == "HybridModel" and c.__module__.startswith("megatron.core.") for c in type(model).__mro__)


@dataclass(frozen=True)
class Pattern:
    """A HybridModel's layers: its main pattern's symbols (stage separators removed) and, per
    symbol, the Hugging Face layer it belongs to."""

    symbols: str
    """One symbol per layer of the whole model, in order (``|`` removed)."""
    hf_layers: tuple[int, ...]
    """Per symbol, the index of the Hugging Face layer it is part of."""

    @property
    def layers(self) -> int:
        """The Hugging Face layers: one per ``*``."""
        return self.symbols.count(ATTENTION)

    @property
    def moe(self) -> list[bool]:
        """Per Hugging Face layer, whether its MLP is MoE (``E``)."""
        return [s == MOE for s in self.symbols if s != ATTENTION]


def parse(text: object) -> Pattern:
    """The :class:`Pattern` of a ``hybrid_layer_pattern``; ``ValueError`` naming the first symbol
    (and its layer) that has no Hugging Face counterpart, or a pairing that is not attention-then-MLP."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"module: the HybridModel's hybrid_layer_pattern is {text!r}; modelinit maps a pattern of "
                         "attention-then-MLP pairs ('*-' or '*E' per layer, '|' between pipeline stages)")
    main, slash, mtp = text.partition("/")
    if slash:
        raise ValueError(f"module: the HybridModel's hybrid_layer_pattern {text!r} has multi-token prediction layers "
                         f"('/{mtp}'), whose tensors no Hugging Face folder modelinit writes holds; build the model "
                         "without them to fill it, and initialize them by Megatron's own init")
    symbols = main.replace("|", "")
    hf: list[int] = []
    for k, s in enumerate(symbols):
        if s in _REFUSED:
            raise ValueError(f"module: the HybridModel's layer {k} is {s!r}, {_REFUSED[s]}, in hybrid_layer_pattern "
                             f"{text!r}; modelinit maps attention ('*'), MLP ('-') and MoE ('E') layers")
        want = ATTENTION if k % 2 == 0 else "-E"
        if s not in want:
            raise ValueError(
                f"module: the HybridModel's layer {k} is {s!r} where {'an attention layer' if k % 2 == 0 else 'an MLP'}"
                f" ({' or '.join(map(repr, want))}) goes, in hybrid_layer_pattern {text!r}: modelinit maps the "
                "pattern's layers to Hugging Face layers by position, attention then MLP ('*-' or '*E' per layer), "
                "as Megatron's migration from GPTModel pairs them")
        hf.append(k // 2)
    if len(symbols) % 2:
        raise ValueError(f"module: the HybridModel's last layer ({len(symbols) - 1}, '*') has no MLP after it, in "
                         f"hybrid_layer_pattern {text!r}: modelinit maps attention-then-MLP pairs ('*-' or '*E')")
    return Pattern(symbols, tuple(hf))


def pattern_of(model) -> Pattern:
    """``model``'s :class:`Pattern`, checked against the layers this rank built (``HybridStack``'s
    ``layer_type_list`` from the global index of its first layer)."""
    pattern = parse(getattr(model, "hybrid_layer_pattern", None))
    decoder = getattr(model, "decoder", None)
    built = list(getattr(decoder, "layer_type_list", None) or ())
    layers = list(getattr(decoder, "layers", None) or ())
    if layers:
        first = layers[0].layer_number - 1
        if "".join(built) != pattern.symbols[first:first + len(built)] or len(built) != len(layers):
            raise ValueError(f"module: the HybridModel's layers {first}.. are {''.join(built)!r}, not its "
                             f"hybrid_layer_pattern's {pattern.symbols[first:first + len(layers)]!r}; modelinit "
                             "reads which layer is which from the pattern")
    return pattern


def hf_layer_of(pattern: Pattern, key: str, symbol: int) -> int:
    """The Hugging Face layer of Megatron's per-layer key ``key`` (without its index) saved at
    ``symbol``: an attention tensor must sit at a ``*``, an MLP's at a ``-`` or ``E``."""
    if not 0 <= symbol < len(pattern.symbols):
        raise ValueError(f"module: Megatron saves {key!r} at layer {symbol}, past the {len(pattern.symbols)} layers of "
                         "its hybrid_layer_pattern")
    attention = key.startswith(("decoder.layers.self_attention.", "decoder.layers.input_layernorm."))
    if attention != (pattern.symbols[symbol] == ATTENTION):
        raise ValueError(f"module: Megatron saves {key!r} at layer {symbol}, a {pattern.symbols[symbol]!r} layer of its "
                         "hybrid_layer_pattern; this layout is not supported")
    return pattern.hf_layers[symbol]
