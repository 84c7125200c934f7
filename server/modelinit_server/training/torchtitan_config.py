"""A torchtitan model's Hugging Face config, derived from its own configuration (``model.config``)
where the mapping is exact: what ``init_module_(model, seed=...)`` fills it with when no ``spec`` is
given (``TorchtitanStack.own_config``).

torchtitan 0.3.0 writes no Hugging Face config of its own (its ``StateDictAdapter`` maps tensor
names only), so the fields are read here off the fully specified config tree its ``model_registry``
builds: the sizes of the modules themselves (``tok_embeddings.num_embeddings``, ``layers[i]
.feed_forward.w1.out_features``: the FFN width as ``compute_ffn_hidden_dim`` computed it from
``multiple_of`` / ``ffn_dim_multiplier``), every norm's ``eps``, every layer's RoPE, the MoE's
router and experts, DeepSeek-V3's MLA ranks. A Hugging Face config states each once for the whole
model; a field it cannot state (layers that differ, a bias or a norm transformers' class does not
build, a routing or a RoPE variant it does not implement) is refused by its torchtitan path
(``module.config.layers[1].attention.n_heads: ...``), with the fix: give ``spec=``.

Whatever is derived, the layout then checks it against the model as it does a given spec: every
tensor torchtitan's ``to_hf`` stores must be the spec's, with its shape. Fields that decide no
tensor and that torchtitan does not hold (token ids, ``initializer_range``) keep transformers'
defaults; ``max_position_embeddings`` is the RoPE's ``max_seq_len`` (torchtitan's trainer sets it
to ``training.seq_len``).
"""
from __future__ import annotations

from typing import Any

from .families import header

#: torchtitan's model families this derives a config for -> the function that does.
FAMILIES = ("llama3", "qwen3", "deepseek_v3")

_FIX = "give the Hugging Face config this model corresponds to: init_module_(model, spec=...)"


def _refuse(path: str, why: str) -> ValueError:
    return ValueError(f"module.config.{path}: {why}; {_FIX}")


def own_config(model) -> dict[str, Any]:
    """The Hugging Face config document of a torchtitan model (its wrappers removed)."""
    config = getattr(model, "config", None)
    family = type(config).__module__.split(".")[2] if type(config).__module__.startswith("torchtitan.models.") else ""
    if family not in FAMILIES:
        raise ValueError(f"module: {type(model).__name__}'s config ({type(config).__qualname__}) is not one modelinit "
                         f"derives a Hugging Face config from ({', '.join(FAMILIES)}); {_FIX}")
    return {"llama3": _llama3, "qwen3": _qwen3, "deepseek_v3": _deepseek_v3}[family](config)


def _one(values: list[tuple[str, Any]], hf_field: str) -> Any:
    """The value every path holds, or a refusal naming the first that differs."""
    first_path, first = values[0]
    for path, value in values[1:]:
        if value != first:
            raise _refuse(path, f"{value!r} differs from {first_path}'s {first!r}, and a Hugging Face config has one "
                                f"{hf_field} for the whole model")
    return first


def _type(cfg, path: str, *names: str) -> str:
    name = type(cfg).__qualname__.rpartition(".Config")[0] or type(cfg).__qualname__
    if name not in names:
        raise _refuse(path, f"a {name} has no Hugging Face counterpart here (known: {', '.join(names)})")
    return name


def _no_bias(linear, path: str) -> None:
    if getattr(linear, "bias", False):
        raise _refuse(f"{path}.bias", "True, and the Hugging Face class builds this projection without a bias")


def _norms(config) -> list[tuple[str, Any]]:
    """(path, RMSNorm config) of every norm the model builds."""
    out = [("norm", config.norm)]
    for i, layer in enumerate(config.layers):
        out += [(f"layers[{i}].attention_norm", layer.attention_norm), (f"layers[{i}].ffn_norm", layer.ffn_norm)]
        att = layer.attention
        if getattr(att, "qk_norm", None) is not None:
            out.append((f"layers[{i}].attention.qk_norm", att.qk_norm))
        if hasattr(att, "kv_norm"):
            out.append((f"layers[{i}].attention.kv_norm", att.kv_norm))
            if att.q_lora_rank:
                out.append((f"layers[{i}].attention.q_norm", att.q_norm))
    return out


def _decoder(config, hf_norm_eps: str = "rms_norm_eps") -> dict[str, Any]:
    """What every decoder states: sizes, tying, norms, the embedding and the head."""
    vocab, dim = config.vocab_size, config.dim
    if not config.layers:
        raise _refuse("layers", "empty")
    for path, got in (("tok_embeddings.num_embeddings", config.tok_embeddings.num_embeddings),
                      ("lm_head.out_features", config.lm_head.out_features)):
        if got != vocab:
            raise _refuse(path, f"{got} is not vocab_size {vocab}, and a Hugging Face config has one vocab_size")
    for path, got in (("tok_embeddings.embedding_dim", config.tok_embeddings.embedding_dim),
                      ("lm_head.in_features", config.lm_head.in_features)):
        if got != dim:
            raise _refuse(path, f"{got} is not dim {dim}")
    _no_bias(config.lm_head, "lm_head")
    norms = _norms(config)
    for path, norm in norms:
        if not norm.elementwise_affine:
            raise _refuse(f"{path}.elementwise_affine", "False: the Hugging Face class's RMSNorm has a weight")
    return {"vocab_size": vocab, "hidden_size": dim, "num_hidden_layers": len(config.layers),
            "tie_word_embeddings": bool(config.enable_weight_tying),
            hf_norm_eps: _one([(f"{p}.eps", n.eps) for p, n in norms], hf_norm_eps)}


def _rope(config, head_dim_of, *, yarn: bool) -> dict[str, Any]:
    """``max_position_embeddings``, ``rope_theta`` and ``rope_scaling`` of the layers' one RoPE."""
    ropes = [(f"layers[{i}].attention.rope", layer.attention.rope) for i, layer in enumerate(config.layers)]
    rope = _one(ropes, "RoPE (rope_theta, rope_scaling, max_position_embeddings)")
    want = head_dim_of(config.layers[0].attention)
    if rope.dim != want:
        raise _refuse("layers[0].attention.rope.dim", f"{rope.dim}, not the rotary head size {want} (a partial "
                                                      "rotary embedding is not mapped)")
    out: dict[str, Any] = {"max_position_embeddings": rope.max_seq_len, "rope_theta": float(rope.theta)}
    if rope.scaling == "llama" and not yarn:
        out["rope_scaling"] = {"rope_type": "llama3", "factor": float(rope.scaling_factor),
                               "low_freq_factor": float(rope.low_freq_factor),
                               "high_freq_factor": float(rope.high_freq_factor),
                               "original_max_position_embeddings": rope.original_max_position_embeddings}
    elif rope.scaling == "yarn" and yarn:
        mscale = float(config.layers[0].attention.mscale)  # the softmax scale's; the rotation itself is not scaled
        out["rope_scaling"] = {"rope_type": "yarn", "factor": float(rope.rope_factor), "beta_fast": float(rope.beta_fast),
                               "beta_slow": float(rope.beta_slow), "mscale": mscale, "mscale_all_dim": mscale,
                               "original_max_position_embeddings": rope.original_seq_len}
        if not rope.truncate:
            out["rope_scaling"]["truncate"] = False
    elif rope.scaling != "none":
        raise _refuse("layers[0].attention.rope.scaling", f"{rope.scaling!r} is not mapped for this family (Llama 3 "
                                                          "and Qwen3: 'llama' or 'none'; DeepSeek-V3: 'yarn' or 'none')")
    return out


def _gqa(config, *, qk_norm: bool) -> dict[str, Any]:
    """Llama 3 / Qwen3 attention: heads, KV heads, head size, biases, q/k norms."""
    def fields(i: int, att) -> dict[str, Any]:
        path = f"layers[{i}].attention"
        _type(att, path, "GQAttention")
        qkv = att.qkv_linear
        kind = _type(qkv, f"{path}.qkv_linear", "FusedQKVLinear", "QKVLinear", "AllGatherFusedQKVLinear")
        projections = [qkv.wq, qkv.wkv] if kind == "QKVLinear" else [qkv.wqkv]
        biases = {bool(p.bias) for p in projections} | {bool(att.wo.bias)}
        if len(biases) > 1:
            raise _refuse(f"{path}.wo.bias", "differs from the q/k/v projections' bias, and a Hugging Face config has "
                                             "one attention_bias for q, k, v and o")
        if (att.qk_norm is not None) != qk_norm:
            raise _refuse(f"{path}.qk_norm", "set, and Llama has no q/k norms" if att.qk_norm is not None
                          else "None, and Qwen3 has q/k norms")
        return {"num_attention_heads": att.n_heads, "num_key_value_heads": att.n_kv_heads or att.n_heads,
                "head_dim": qkv.head_dim, "attention_bias": biases.pop()}

    per_layer = [fields(i, layer.attention) for i, layer in enumerate(config.layers)]
    return {k: _one([(f"layers[{i}].attention ({k})", f[k]) for i, f in enumerate(per_layer)], k) for k in per_layer[0]}


def _ffn(ffn, path: str) -> tuple[int, bool]:
    """A SwiGLU FeedForward's hidden size and bias."""
    _type(ffn, path, "FeedForward", "AllGatherFusedFeedForward")
    hidden = ffn.w1.out_features
    for name, got in (("w3.out_features", ffn.w3.out_features), ("w2.in_features", ffn.w2.in_features)):
        if got != hidden:
            raise _refuse(f"{path}.{name}", f"{got} is not w1's {hidden}")
    biases = {bool(ffn.w1.bias), bool(ffn.w2.bias), bool(ffn.w3.bias)}
    if len(biases) > 1:
        raise _refuse(f"{path}.w2.bias", "differs from w1's or w3's, and a Hugging Face config has one mlp_bias")
    return hidden, biases.pop()


def _llama3(config) -> dict[str, Any]:
    doc = {**header("llama"), **_decoder(config)}
    att = _gqa(config, qk_norm=False)
    ffns = [(f"layers[{i}].feed_forward", layer.feed_forward) for i, layer in enumerate(config.layers)]
    for i, layer in enumerate(config.layers):
        if layer.moe is not None or layer.feed_forward is None:
            raise _refuse(f"layers[{i}].moe", "set, and Llama has no MoE layers")
    sizes = [(p, _ffn(f, p)) for p, f in ffns]
    hidden = _one([(f"{p}.w1.out_features", h) for p, (h, _) in sizes], "intermediate_size")
    mlp_bias = _one([(f"{p}.w1.bias", b) for p, (_, b) in sizes], "mlp_bias")
    doc.update(intermediate_size=hidden, num_attention_heads=att["num_attention_heads"],
               num_key_value_heads=att["num_key_value_heads"], attention_bias=att["attention_bias"], mlp_bias=mlp_bias)
    if att["head_dim"] != config.dim // att["num_attention_heads"]:
        doc["head_dim"] = att["head_dim"]
    doc.update(_rope(config, lambda a: a.qkv_linear.head_dim, yarn=False))
    return doc


def _router(moe, path: str, *, score_func: str) -> dict[str, Any]:
    router = moe.router
    if router.score_func != score_func:
        raise _refuse(f"{path}.router.score_func", f"{router.score_func!r}, and the Hugging Face class routes by "
                                                   f"{score_func}")
    _no_bias(router.gate, f"{path}.router.gate")
    experts = moe.routed_experts.inner_experts
    if not (router.num_experts == experts.num_experts == moe.num_experts):
        raise _refuse(f"{path}.routed_experts.inner_experts.num_experts", f"{experts.num_experts}, the router has "
                                                                          f"{router.num_experts}")
    return {"experts": moe.num_experts, "top_k": router.top_k, "hidden": experts.hidden_dim,
            "norm": bool(router.route_norm), "scale": float(router.route_scale),
            "groups": router.num_expert_groups, "limited": router.num_limited_groups}


def _qwen3(config) -> dict[str, Any]:
    base = _decoder(config)
    att = _gqa(config, qk_norm=True)
    if att["attention_bias"]:
        raise _refuse("layers[0].attention.wo.bias", "True: modelinit maps Qwen3 without attention biases")
    dense, moes = [], []
    for i, layer in enumerate(config.layers):
        path = f"layers[{i}]"
        if layer.moe is None:
            hidden, bias = _ffn(layer.feed_forward, f"{path}.feed_forward")
            if bias:
                raise _refuse(f"{path}.feed_forward.w1.bias", "True, and Qwen3's MLP has no bias")
            dense.append((i, (f"{path}.feed_forward", hidden)))
            continue
        if layer.feed_forward is not None:
            raise _refuse(f"{path}.feed_forward", "set next to a MoE, and a Qwen3 layer has one or the other")
        if layer.moe.shared_experts is not None:
            raise _refuse(f"{path}.moe.shared_experts", "set, and Qwen3-MoE has no shared experts")
        r = _router(layer.moe, f"{path}.moe", score_func="softmax")
        if r["scale"] != 1.0 or r["groups"] not in (None, 1):
            raise _refuse(f"{path}.moe.router", "route_scale or num_expert_groups set, and Qwen3-MoE has neither")
        moes.append((f"{path}.moe", (r["experts"], r["top_k"], r["hidden"], r["norm"])))
    doc = {**base, "head_dim": att["head_dim"], "num_attention_heads": att["num_attention_heads"],
           "num_key_value_heads": att["num_key_value_heads"], "attention_bias": False}
    if dense:
        doc["intermediate_size"] = _one([d for _, d in dense], "intermediate_size")
    if moes:
        experts, top_k, hidden, norm = _one(moes, "MoE (num_experts, num_experts_per_tok, moe_intermediate_size, "
                                                  "norm_topk_prob)")
        doc = {**header("qwen3_moe"), **doc, "num_experts": experts,
               "num_experts_per_tok": top_k, "moe_intermediate_size": hidden, "norm_topk_prob": norm,
               "decoder_sparse_step": 1, "mlp_only_layers": [i for i, _ in dense]}
    else:
        doc = {**header("qwen3"), **doc}
    doc.update(_rope(config, lambda a: a.qkv_linear.head_dim, yarn=False))
    return doc


def _deepseek_v3(config) -> dict[str, Any]:
    if getattr(config, "mtp_layers", None):
        raise _refuse("mtp_layers", f"{len(config.mtp_layers)} multi-token-prediction layer(s), which transformers' "
                                    "DeepseekV3ForCausalLM does not hold (transformers builds them apart, as "
                                    "the drafting model MtpModel)")
    base = _decoder(config)
    mla = []
    for i, layer in enumerate(config.layers):
        att, path = layer.attention, f"layers[{i}].attention"
        _type(att, path, "Attention")
        for name in ("wq", "wq_a", "wq_b", "wkv_a", "wkv_b", "wo"):
            if getattr(att, name, None) is not None:
                _no_bias(getattr(att, name), f"{path}.{name}")
        mla.append((path, (att.n_heads, att.q_lora_rank or None, att.kv_lora_rank, att.qk_nope_head_dim,
                           att.qk_rope_head_dim, att.v_head_dim, att.mscale)))
    heads, q_lora, kv_lora, nope, rope_dim, v_dim, _ = _one(mla, "MLA (heads, LoRA ranks, head sizes)")
    dense = 0
    while dense < len(config.layers) and config.layers[dense].moe is None:
        dense += 1
    doc = {**header("deepseek_v3"), **base,
           "num_attention_heads": heads, "num_key_value_heads": heads, "q_lora_rank": q_lora, "kv_lora_rank": kv_lora,
           "qk_nope_head_dim": nope, "qk_rope_head_dim": rope_dim, "v_head_dim": v_dim,
           "first_k_dense_replace": dense, "attention_bias": False}
    if dense:
        sizes = []
        for i in range(dense):
            hidden, bias = _ffn(config.layers[i].feed_forward, f"layers[{i}].feed_forward")
            if bias:
                raise _refuse(f"layers[{i}].feed_forward.w1.bias", "True, and DeepSeek-V3's MLP has no bias")
            sizes.append((f"layers[{i}].feed_forward", hidden))
        doc["intermediate_size"] = _one(sizes, "intermediate_size")
    moes = []
    for i in range(dense, len(config.layers)):
        layer, path = config.layers[i], f"layers[{i}].moe"
        if layer.moe is None:
            raise _refuse(path, f"None after MoE layers, and DeepSeek-V3's dense layers are its first "
                                f"first_k_dense_replace ({dense})")
        r = _router(layer.moe, path, score_func="sigmoid")
        shared = layer.moe.shared_experts
        if shared is None:
            raise _refuse(f"{path}.shared_experts", "None, and DeepSeek-V3 has shared experts")
        width, bias = _ffn(shared, f"{path}.shared_experts")
        if bias or width % r["hidden"]:
            raise _refuse(f"{path}.shared_experts.w1", f"{width} wide{' with a bias' if bias else ''}: not "
                                                       f"n_shared_experts x moe_intermediate_size ({r['hidden']})")
        if layer.moe.load_balance_coeff is None:
            raise _refuse(f"{path}.load_balance_coeff", "None: the model has no expert bias, and DeepSeek-V3 stores "
                                                        "e_score_correction_bias")
        moes.append((path, (r["experts"], r["top_k"], r["hidden"], r["norm"], r["scale"], r["groups"] or 1,
                            r["limited"] or 1, width // r["hidden"])))
    if moes:
        experts, top_k, hidden, norm, scale, groups, limited, shared = _one(moes, "MoE")
        doc.update(n_routed_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=hidden,
                   norm_topk_prob=norm, routed_scaling_factor=scale, n_group=groups, topk_group=limited,
                   n_shared_experts=shared)
    doc.update(_rope(config, lambda a: a.qk_rope_head_dim, yarn=True))
    return doc
