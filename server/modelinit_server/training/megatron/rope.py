"""What a Megatron-Core model keeps of its RoPE, read back for the Hugging Face config derived
(:mod:`.config`): the frequencies its ``rotary_pos_emb`` holds, HybridModel's base and percent solved
from them (it keeps neither), Llama 3.x's scaling factor solved from GPTModel's (it does not keep it);
and :func:`refuse`, the one-line error of a field that has no counterpart in the config derived."""
from __future__ import annotations

import math
from typing import Any


def refuse(name: str, value: Any, what: str) -> ValueError:
    return ValueError(f"spec: the Megatron model's {name}={value!r} ({what}) has no counterpart in a Hugging Face "
                      "config modelinit derives; give the Hugging Face config this model corresponds to: "
                      "init_module_(model, spec='<preset>' or a config.json path or a dict, ...)")


def frequencies(rope) -> tuple[float, ...]:
    """``rope.inv_freq`` as floats; empty where there is none to read (on the meta device)."""
    freqs = getattr(rope, "inv_freq", None)
    if freqs is None or getattr(freqs, "is_meta", False):
        return ()
    return tuple(float(x) for x in freqs.detach().reshape(-1).tolist())


def rotary_of(config, rope) -> tuple[float, float]:
    """``(rotary_base, rotary_percent)`` of a RotaryEmbedding, from the frequencies it holds:
    Megatron's ``1 / base ** (2i / dim)`` for ``i < dim / 2``, ``dim`` the head dim times the percent.
    The base is solved from the lowest frequency, rounded to 6 significant digits, and checked on
    every one (relative 1e-5: Megatron computes them in float32)."""
    held = frequencies(rope)
    what = "HybridModel keeps no rotary_base; it is read off rotary_pos_emb.inv_freq"
    if len(held) < 2 or not all(math.isfinite(f) and f > 0 for f in held):
        raise refuse("rotary_base", None, f"{what}, which holds {len(held)} usable frequencies (on the meta "
                      "device: none)")
    dim = 2 * len(held)
    head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
    base = float(f"{held[-1] ** (-dim / (2 * (len(held) - 1))):.6g}")
    if any(abs(base ** (-2 * i / dim) - f) > 1e-5 * f for i, f in enumerate(held)):
        raise refuse("rotary_base", base, f"{what}, whose frequencies no base gives as Megatron computes them")
    return base, (1.0 if dim == head_dim else dim / head_dim)


#: Megatron's Llama 3.x RoPE scaling (``RotaryEmbedding._apply_scaling``, called with the factor
#: alone) keeps Llama 3.1's bands; transformers' ``llama3`` rope type takes the same values.
_LLAMA3_BANDS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _llama3_scaled(freq: float, factor: float) -> float:
    """An unscaled rotary frequency after Llama 3.x's scaling by ``factor``, with the bands above
    (the formula Megatron and transformers share): a wavelength ``2 pi / freq`` under 8192 / 4 is
    kept, one over 8192 divided by ``factor``, and one between is ``(1 - s) freq / factor + s freq``
    with ``s = (8192 / wavelength - 1) / (4 - 1)``."""
    context, low, high = (_LLAMA3_BANDS[k] for k in ("original_max_position_embeddings", "low_freq_factor",
                                                     "high_freq_factor"))
    wavelength = 2 * math.pi / freq
    if wavelength < context / high:
        return freq
    if wavelength > context / low:
        return freq / factor
    smooth = (context / wavelength - low) / (high - low)
    return (1 - smooth) * freq / factor + smooth * freq


def llama3_scaling(rotary_base: float, held: tuple[float, ...], dim: int) -> dict[str, Any]:
    """``rope_scaling`` of a model built with ``rope_scaling=True``: GPTModel does not keep the
    factor, so it is solved from the lowest of the frequencies it holds (``gpt.inv_freq``) against
    the unscaled ``rotary_base ** (-2i / dim)``, then checked on every frequency (relative 1e-5:
    Megatron computes them in float32)."""
    plain = [1.0 / float(rotary_base) ** (2 * i / dim) for i in range((dim + 1) // 2)]
    what = "Llama 3.x's RoPE scaling, whose factor GPTModel does not keep"
    if len(held) != len(plain) or not all(math.isfinite(f) and f > 0 for f in held):
        raise refuse("rope_scaling", True, f"{what}; its rotary_pos_emb.inv_freq, where the factor is read from, "
                      f"has {len(held)} frequencies (on the meta device: none), not {len(plain)}")
    lowest, scaled = plain[-1], held[-1]
    wavelength, context = 2 * math.pi / lowest, _LLAMA3_BANDS["original_max_position_embeddings"]
    factor = None
    if wavelength > context:
        factor = lowest / scaled
    elif wavelength >= context / _LLAMA3_BANDS["high_freq_factor"]:
        smooth = (context / wavelength - 1) / (_LLAMA3_BANDS["high_freq_factor"] - 1)
        if scaled / lowest > smooth:
            factor = (1 - smooth) / (scaled / lowest - smooth)
    if factor is None:
        raise refuse("rope_scaling", True, f"{what}; every rotary wavelength is under {context // 4}, which "
                      "Llama 3.x's scaling keeps, so the factor cannot be read")
    factor = float(f"{factor:.4g}")
    if any(abs(_llama3_scaled(p, factor) - h) > 1e-5 * h for p, h in zip(plain, held)):
        raise refuse("rope_scaling", True, f"{what}; rotary_pos_emb.inv_freq is not the unscaled frequencies "
                      f"scaled as Llama 3.x scales them (the nearest factor, {factor}, does not give them)")
    return {"rope_type": "llama3", "factor": factor, **_LLAMA3_BANDS}
