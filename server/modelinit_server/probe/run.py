"""One probe pass: the real model filled with a policy's exact bytes, a synthetic batch made from
the seed, one forward and one backward pass, measured per layer (:mod:`.measures`).

The model is the transformers class of the spec (built-in presets included), float32 on the CPU,
eager attention (so the attention probabilities exist), in eval mode (no dropout: the same request
gives the same numbers), filled by ``init_module_`` with the request's policy and seed: exactly
the bytes ``modelinit init`` writes.
"""
from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Any

from ..architectures import meta_models
from ..core.planner import Request
from ..engine import Sampler, tensor_key
from ..engine.reference import transform, uniforms
from .measures import LayerMeasures, ModelMeasures, attention_stats, first_nonfinite, tensor_std

#: Suffixes of classes whose labels are the input tokens (the loss is next- or masked-token CE).
TOKEN_HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration", "WithLMHead")
#: Block classes: what a transformer stack repeats.
_BLOCK = re.compile(r"(Layer|Block)$")


@dataclass(frozen=True)
class Batch:
    """The synthetic batch: its inputs, its labels (or None) and the loss of uniform predictions."""

    inputs: dict[str, Any]
    labels: Any
    reference_loss: float | None
    description: str


def estimate_bytes(n_params: int, batch: int, seq: int, hidden: int, layers: int, heads: int) -> int:
    """What a probe pass holds at its peak, roughly: float32 weights and gradients, the
    activations autograd keeps (~40 floats per token and width per layer) and the attention
    probabilities (kept, with their gradients)."""
    weights = 2 * 4 * n_params
    activations = 4 * 40 * batch * seq * hidden * max(layers, 1)
    attention = 4 * 3 * batch * max(heads, 1) * seq * seq * max(layers, 1)
    return weights + activations + attention


def _ints(seed: int, stream: str, n: int, high: int):
    """``n`` integers in [0, high) from the engine (version-2 keys, stream named like a tensor)."""
    import numpy as np
    import torch

    u = uniforms(tensor_key(seed, stream, 2), 0, n)
    return torch.from_numpy(np.minimum((u * high).astype(np.int64), high - 1))


def _normals(seed: int, stream: str, shape: tuple[int, ...]):
    import torch

    n = math.prod(shape)
    return torch.from_numpy(transform(Sampler("normal"), uniforms(tensor_key(seed, stream, 2), 0, n))).float().reshape(shape)


def make_batch(model, seed: int, batch: int, seq: int) -> Batch:
    """Token ids for text models, pixel values for vision models, from the seed; a ValueError
    naming the input otherwise."""
    cls = type(model).__name__
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    labelled = "labels" in params
    num_labels = int(getattr(config, "num_labels", 2) or 2)
    if main == "input_ids":
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        vocab = int(getattr(text, "vocab_size", 0) or 0)
        if vocab < 2:
            raise ValueError(f"probe: {cls} has no vocabulary size in its config; the probe cannot make its token ids")
        limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
        if isinstance(limit, int) and limit > 0:
            seq = min(seq, limit - 2 if limit > 4 else limit)  # RoBERTa-style offsets take 2 positions
        ids = _ints(seed, "probe.input_ids", batch * seq, vocab).reshape(batch, seq)
        inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": ids.new_ones(ids.shape)}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            inputs["decoder_input_ids"] = ids.clone()
        if labelled and cls.endswith(TOKEN_HEADS):
            return Batch(inputs, ids.clone(), math.log(vocab), f"{batch} x {seq} token ids (vocabulary {vocab})")
        if labelled and cls.endswith("ForSequenceClassification"):
            labels = _ints(seed, "probe.labels", batch, num_labels)
            return Batch(inputs, labels, math.log(num_labels), f"{batch} x {seq} token ids, {num_labels} classes")
        if labelled and cls.endswith("ForTokenClassification"):
            labels = _ints(seed, "probe.labels", batch * seq, num_labels).reshape(batch, seq)
            return Batch(inputs, labels, math.log(num_labels), f"{batch} x {seq} token ids, {num_labels} classes")
        return Batch(inputs, None, None, f"{batch} x {seq} token ids (no head: loss = mean(h^2)/2)")
    if main == "pixel_values":
        vision = getattr(config, "vision_config", None) or config
        size = getattr(vision, "image_size", None)
        channels = int(getattr(vision, "num_channels", 3) or 3)
        size = size[0] if isinstance(size, (list, tuple)) else size
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"probe: {cls} has no image_size in its config; the probe cannot make its pixel values")
        pixels = _normals(seed, "probe.pixel_values", (batch, channels, size, size))
        inputs = {"pixel_values": pixels}
        if labelled and cls.endswith("ForImageClassification"):
            labels = _ints(seed, "probe.labels", batch, num_labels)
            return Batch(inputs, labels, math.log(num_labels), f"{batch} images {channels}x{size}x{size}, {num_labels} classes")
        return Batch(inputs, None, None, f"{batch} images {channels}x{size}x{size} (no head: loss = mean(h^2)/2)")
    raise ValueError(f"probe: {cls} takes {main!r}, an input the probe cannot make; it makes token ids (text models) "
                     "and pixel values (vision models)")


def build(request: Request):
    """The float32 CPU model of ``request``'s spec, eager attention, filled with its policy and seed."""
    import torch

    from ..training import init_module_

    spec = request.model
    model = meta_models.meta_model(dict(spec.config), spec.architecture, attention="eager")
    model.to_empty(device="cpu")  # then tied: moving a meta model's tensors breaks its ties
    with meta_models.quiet():
        model.tie_weights()
    _computed_buffers(model)
    model.to(torch.float32)
    model.eval()
    init_module_(model, seed=request.seed, policy=request.policy, algorithm_version=request.algorithm_version)
    return model


#: transformers.initialization functions that draw (skipped: init_module_ overwrites what they write).
_DRAWS = ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
          "kaiming_normal_", "orthogonal_", "sparse_")


def _computed_buffers(model) -> None:
    """What ``to_empty`` leaves unset and init_module_ does not fill: non-persistent buffers
    (``position_ids``, rotary ``inv_freq``), which transformers' own initialization computes. It runs
    with its draws skipped (init_module_ writes every stored tensor afterwards)."""
    import transformers.initialization as init_module

    originals = {name: getattr(init_module, name) for name in _DRAWS}
    try:
        for name in _DRAWS:
            setattr(init_module, name, lambda tensor, *a, **k: tensor)
        meta_models.clear_init_flags(model)
        with meta_models.quiet():
            model.initialize_weights()
    finally:
        for name, fn in originals.items():
            setattr(init_module, name, fn)


def stacks(model) -> list[tuple[str, Any]]:
    """The model's stacks of blocks: the outermost ModuleLists whose children are one ``*Layer`` /
    ``*Block`` class, by path, in module order."""
    import torch

    found: list[tuple[str, Any]] = []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.ModuleList) or len(m) == 0:
            continue
        kinds = {type(c).__name__ for c in m}
        if len(kinds) != 1 or not _BLOCK.search(next(iter(kinds))):
            continue
        if any(name.startswith(path + ".") for path, _ in found):
            continue
        found.append((name, m))
    return found


def branch_modules(model, spec, blocks) -> dict[tuple[str, int], dict[str, Any]]:
    """{(stack path, layer): {"attn" | "mlp": the module whose output is that branch's}}: the
    modules holding the spec's ``attn_out`` / ``mlp_out`` weights, where the model has them under
    the stored name (experts stored per expert are not modules of the fused model: skipped)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for t in spec.tensors:
        if t.param != "weight" or t.role not in ("attn_out", "mlp_out") or not t.name.endswith(".weight"):
            continue
        path = t.name[: -len(".weight")]
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        for stack, layers in blocks:
            for i in range(len(layers)):
                if path.startswith(f"{stack}.{i}."):
                    out.setdefault((stack, i), {}).setdefault("attn" if t.role == "attn_out" else "mlp", module)
    return out


def measure(model, batch: Batch, spec=None) -> ModelMeasures:
    """One forward and backward pass of ``model`` on ``batch``, measured per layer of its stacks."""
    blocks = stacks(model)
    if not blocks:
        raise ValueError(f"probe: {type(model).__name__} has no stack of layers the probe recognises (a ModuleList of "
                         "*Layer or *Block modules)")
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    branches: dict[tuple[str, int, str], float] = {}
    handles = _watch(model, blocks, spec, seen, branches)
    try:
        out, loss, logits = _forward_backward(model, batch, blocks, seen)
    finally:
        for h in handles:
            h.remove()
    layers = _layer_measures(model, blocks, seen, branches, _attentions(out, blocks))
    first = seen.get((blocks[0][0], 0), {}).get("in")
    nonfinite = first_nonfinite(
        [("loss", loss), ("logits", logits)]
        + [(f"{_label(p, blocks)} layer {i} output", seen.get((p, i), {}).get("out")) for p, s in blocks for i in range(len(s))]
    )
    return ModelMeasures(
        loss=float(loss.detach()),
        reference_loss=batch.reference_loss,
        logit_std=tensor_std(logits) if logits is not None else None,
        embedding_std=tensor_std(first) if first is not None else float("nan"),
        layers=tuple(layers),
        nonfinite=tuple(nonfinite),
    )


def _watch(model, blocks, spec, seen: dict, branches: dict) -> list:
    """Hooks that keep each block's input and output (``seen``, the output's gradient retained) and
    each attention and MLP branch's output std (``branches``); returns their handles."""
    import torch

    handles = []

    def hooks(path: str, i: int, block):
        def pre(module, args, kwargs):
            h = args[0] if args else kwargs.get("hidden_states")
            if isinstance(h, torch.Tensor):
                seen.setdefault((path, i), {})["in"] = h

        def post(module, args, kwargs, output):
            h = output[0] if isinstance(output, (tuple, list)) else getattr(output, "last_hidden_state", output)
            if isinstance(h, torch.Tensor):
                if h.requires_grad:
                    h.retain_grad()
                seen.setdefault((path, i), {})["out"] = h

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))

    for path, stack in blocks:
        for i, block in enumerate(stack):
            hooks(path, i, block)

    def branch_hook(key: tuple[str, int, str]):
        def hook(module, args, output):
            h = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(h, torch.Tensor):
                branches[key] = tensor_std(h)

        return hook

    for (path, i), found in (branch_modules(model, spec, blocks) if spec is not None else {}).items():
        for which, module in found.items():
            handles.append(module.register_forward_hook(branch_hook((path, i, which))))
    return handles


def _forward_backward(model, batch: Batch, blocks, seen: dict):
    """The forward pass (attentions out) and the backward pass of its loss: the model's own with
    labels, else half the mean square of its last hidden state. Returns (output, loss, logits)."""
    kwargs: dict[str, Any] = dict(batch.inputs, output_attentions=True)
    if batch.labels is not None:
        kwargs["labels"] = batch.labels
    with meta_models.quiet():
        out = model(**kwargs)
    logits = getattr(out, "logits", None)
    if batch.labels is not None and getattr(out, "loss", None) is not None:
        loss = out.loss
    else:
        last = getattr(out, "last_hidden_state", None)
        if last is None:
            last = logits if logits is not None else seen[(blocks[-1][0], len(blocks[-1][1]) - 1)]["out"]
        loss = 0.5 * last.float().pow(2).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return out, loss, logits


def _layer_measures(model, blocks, seen: dict, branches: dict, attentions: dict) -> list[LayerMeasures]:
    """Each block's measures from what the hooks kept: its residual std and update ratio, its branches
    against its input, its parameters' gradient norm and its output's gradient, its attention."""
    layers = []
    named = dict(model.named_parameters())
    for path, stack in blocks:
        label = _label(path, blocks)
        probs = attentions.get(path)
        for i in range(len(stack)):
            got = seen.get((path, i), {})
            h_in, h_out = got.get("in"), got.get("out")
            res = tensor_std(h_out) if h_out is not None else float("nan")
            base = tensor_std(h_in) if h_in is not None else 0.0
            if h_in is not None and h_out is not None and h_in.shape == h_out.shape:
                ratio = tensor_std(h_out.detach() - h_in.detach()) / base if base > 0 else float("inf")
            else:
                ratio = float("nan")
            attn_b, mlp_b = branches.get((path, i, "attn")), branches.get((path, i, "mlp"))
            attn_b = attn_b / base if attn_b is not None and base > 0 else None
            mlp_b = mlp_b / base if mlp_b is not None and base > 0 else None
            grads = [p.grad for n, p in named.items() if n.startswith(f"{path}.{i}.") and p.grad is not None]
            gnorm = math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads)) if grads else 0.0
            hgrad = tensor_std(h_out.grad) if h_out is not None and h_out.grad is not None else 0.0
            attn = attention_stats(probs[i]) if probs is not None and i < len(probs) and probs[i] is not None else (None,) * 3
            layers.append(LayerMeasures(label, i, res, ratio, gnorm, hgrad, *attn, attn_branch=attn_b, mlp_branch=mlp_b))
    return layers


def _label(path: str, blocks) -> str:
    """``encoder`` / ``decoder`` for a model with two stacks, empty for one."""
    if len(blocks) == 1:
        return ""
    for word in ("encoder", "decoder", "vision", "text"):
        if word in path.split("."):
            return word
    return path


def _attentions(out, blocks) -> dict[str, Any]:
    """Self-attention probabilities by stack path (eager attention returns them per layer)."""
    enc, dec = getattr(out, "encoder_attentions", None), getattr(out, "decoder_attentions", None)
    plain = getattr(out, "attentions", None)
    result = {}
    for path, stack in blocks:
        words = path.split(".")
        probs = enc if "encoder" in words and enc is not None else dec if "decoder" in words and dec is not None else plain
        if probs is not None and len(probs) == len(stack):
            result[path] = probs
    return result
