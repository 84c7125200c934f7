"""Megatron-Core's ``HybridModel`` (0.19's successor to ``GPTModel``, ``megatron.core.models.hybrid``):
one layer per symbol of its ``hybrid_layer_pattern``, and which Hugging Face layer each one is.

A pattern's symbols (Megatron's ``hybrid_layer_allocation.Symbols``): ``*`` attention, ``-`` MLP,
``E`` MoE, ``M`` Mamba, ``G`` gated delta net, ``+`` MLA, ``D`` DeepSeek sparse attention; ``|``
separates pipeline stages and ``/`` starts the multi-token prediction layers. Two mappings:

* **By pairs** (a Llama-style family, the families :mod:`.config` derives for a GPTModel): Megatron's
  own migration from GPTModel pairs the weights by position: a GPT layer is ``*-`` (or ``*E``), so
  Hugging Face layer ``i``'s attention is the pattern's ``i``-th ``*`` and its MLP the ``-`` or ``E``
  right after it, filled as the GPTModel of the same layers is.
* **By symbol** (Nemotron-H, ``nemotron_h``: the Hugging Face family of Megatron's hybrid models,
  whose ``hybrid_override_pattern`` is Megatron's pattern, one layer per symbol): Hugging Face layer
  ``k`` is symbol ``k``, a ``M`` its Mamba-2 mixer, a ``*`` its attention, a ``-`` its MLP, an ``E``
  its MoE (routed experts, a shared expert, the router with its expert bias). A pattern with ``M`` is
  derived as this family; a spec of it maps any pattern of ``M``, ``*``, ``-`` and ``E``.

Every other symbol is refused by name before anything is written: gated delta net (``G``) layers
need ``fla`` and CUDA to be built at all; MLA and DSA are not mapped in a hybrid model.

Megatron saves each layer under its global symbol index (``HybridStack.sharded_state_dict``:
``decoder.layers.<i + the earlier stages' symbols>.``), which :func:`hf_layer_of` turns into the
Hugging Face layer."""
from __future__ import annotations

from dataclasses import dataclass

#: Symbols with a Hugging Face counterpart: attention, then an MLP (dense or MoE); Mamba (Nemotron-H's).
ATTENTION, MLP, MOE, MAMBA = "*", "-", "E", "M"
#: The Hugging Face family whose layers are the pattern's symbols, one each.
BY_SYMBOL = "nemotron_h"
#: The symbols a Nemotron-H layer can be, one each.
BY_SYMBOL_LAYERS = MAMBA + ATTENTION + MLP + MOE
#: The others, each with why it is refused.
_REFUSED = {"G": "a gated delta net layer (needs fla and CUDA: never built or verified here)",
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
    by_symbol: bool = False
    """Whether each symbol is a Hugging Face layer of its own (Nemotron-H), or attention-then-MLP pairs are."""

    @property
    def layers(self) -> int:
        """The Hugging Face layers: one per symbol (by symbol), or one per ``*`` (by pairs)."""
        return len(self.symbols) if self.by_symbol else self.symbols.count(ATTENTION)

    @property
    def moe(self) -> list[bool]:
        """Per Hugging Face layer, whether its MLP is MoE (``E``)."""
        return [s == MOE for s in self.symbols if s != ATTENTION]


def parse(text: object, by_symbol: bool | None = None) -> Pattern:
    """The :class:`Pattern` of a ``hybrid_layer_pattern``, by symbol (Nemotron-H) or by pairs (``None``:
    by symbol where the pattern has a Mamba layer); ``ValueError`` naming the first symbol (and its
    layer) that has no Hugging Face counterpart, or a pairing that is not attention-then-MLP."""
    if not isinstance(text, str) or not text:
        raise ValueError(f"module: the HybridModel's hybrid_layer_pattern is {text!r}; modelinit maps a pattern of "
                         "attention-then-MLP pairs ('*-' or '*E' per layer, '|' between pipeline stages) or of "
                         "Mamba, attention and MLP layers ('M', '*', '-': Nemotron-H)")
    main, slash, mtp = text.partition("/")
    if slash:
        raise ValueError(f"module: the HybridModel's hybrid_layer_pattern {text!r} has multi-token prediction layers "
                         f"('/{mtp}'), whose tensors no Hugging Face folder modelinit writes holds; build the model "
                         "without them to fill it, and initialize them by Megatron's own init")
    symbols = main.replace("|", "")
    if by_symbol is None:
        by_symbol = MAMBA in symbols
    if by_symbol:
        return _by_symbol(text, symbols)
    hf: list[int] = []
    for k, s in enumerate(symbols):
        if s == MAMBA:
            raise ValueError(f"module: the HybridModel's layer {k} is a Mamba layer ('M'), in hybrid_layer_pattern "
                             f"{text!r}, which a Llama-style Hugging Face family has none of; give a Nemotron-H spec "
                             "(model_type nemotron_h, hybrid_override_pattern as Megatron's), or none: it is derived")
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


def _by_symbol(text: str, symbols: str) -> Pattern:
    for k, s in enumerate(symbols):
        if s not in BY_SYMBOL_LAYERS:
            raise ValueError(f"module: the HybridModel's layer {k} is {s!r}, {_REFUSED.get(s, 'not a symbol')}, in "
                             f"hybrid_layer_pattern {text!r}; modelinit maps Mamba ('M'), attention ('*'), MLP ('-') "
                             "and MoE ('E') layers one per Nemotron-H layer")
    return Pattern(symbols, tuple(range(len(symbols))), by_symbol=True)


def pattern_of(model, by_symbol: bool | None = None) -> Pattern:
    """``model``'s :class:`Pattern` (``by_symbol``: as :func:`parse`), checked against the layers this
    rank built (``HybridStack``'s ``layer_type_list`` from the global index of its first layer)."""
    pattern = parse(getattr(model, "hybrid_layer_pattern", None), by_symbol)
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
    if pattern.by_symbol:
        return symbol
    attention = key.startswith(("decoder.layers.self_attention.", "decoder.layers.input_layernorm."))
    if attention != (pattern.symbols[symbol] == ATTENTION):
        raise ValueError(f"module: Megatron saves {key!r} at layer {symbol}, a {pattern.symbols[symbol]!r} layer of its "
                         "hybrid_layer_pattern; this layout is not supported")
    return pattern.hf_layers[symbol]
