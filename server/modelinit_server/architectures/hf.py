"""Any transformers architecture: built on the meta device, its own init recorded, laid out as the hub holds it.

The generic path behind every spec the built-in families do not cover:

1. the config class of ``model_type`` reads the document, and the model class (``architectures[0]``
   or the requested override) is built on the meta device: no memory, milliseconds;
2. the class's own ``initialize_weights()`` runs with the functions of ``transformers.initialization``
   replaced by recorders (:mod:`.recorder`): every write to a stored tensor becomes a distribution
   (never values); a tensor nothing writes, or that is computed rather than drawn, is refused by name;
3. the stored tensors are what ``save_pretrained`` writes: tied weights once, and transformers' own
   reverse weight conversion applied (MoE experts fused in memory are stored per expert, as the hub,
   transformers 4 and vLLM read them); each stored tensor keeps the rule of the tensor it came from;
4. each tensor gets a module kind, a role, a layer index and fans (:mod:`.roles`) so that every
   policy, not only hf-default, applies to any family.

transformers is imported only when a spec needs it, through :mod:`.meta_models` (the model) and here
(its weight conversions).
"""
from __future__ import annotations

import math
from typing import Any

from ..core.tensors import HfInit, ModelSpec, TensorSpec
from ._fields import DROPPED_KEYS, MAX_DIM, invalid
from .computed import replay_of, weight_norm_dim
from .meta_models import build_meta, config_of, default_class, load_transformers, model_class, one_line, quiet
from .recorder import Record, record_init
from .roles import ModuleInfo, describe

def config_document(config, architecture: str) -> dict[str, Any]:
    """A transformers config object as the config.json document a request for class
    ``architecture`` carries: ``to_dict()`` without the fields no spec keeps (:data:`DROPPED_KEYS`:
    the dtype, the transformers version, hub paths and commits)."""
    document = {k: v for k, v in config.to_dict().items() if k not in DROPPED_KEYS}
    document["architectures"] = [architecture]
    return document


def reverse_conversions(model) -> tuple[list[Any], list[Any]]:
    """save_pretrained's reverse weight conversion for ``model``'s class, as (renamings,
    converters) in the order it applies them (PrefixChange entries left out); both empty when the
    class stores its tensors as it holds them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightConverter, WeightRenaming

    with quiet():
        conversions = get_model_conversion_mapping(model, add_legacy=False)
    conversions = [c for c in conversions if not isinstance(c, PrefixChange)]
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    return [c for c in reverse if isinstance(c, WeightRenaming)], [c for c in reverse if isinstance(c, WeightConverter)]


def convert(converter, target: str, model) -> dict[str, Any]:
    """The outputs of a converter of :func:`reverse_conversions` that has been given its input
    tensors (``add_tensor``), by stored name before renaming: one tensor each, quietly."""
    with quiet():
        outputs = converter.convert(target, model=model, config=model.config)
    return {name: (t[0] if isinstance(t, list) else t) for name, t in outputs.items()}


#: Most layers a config may ask for in any one stack (the deepest published models have about 130):
#: transformers constructs every layer to be read, about 10 ms each on the meta device, so the cap is
#: what bounds one request's planning time (found by the ``config`` fuzz target: fuzz/README.md).
MAX_LAYERS = 1024
_DEPTH_FIELDS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                 "num_encoder_layers", "num_decoder_layers", "encoder_num_layers", "decoder_num_layers")


def _check_depth(doc: dict[str, Any], where: str = "") -> None:
    """ValueError naming the field when a stack of ``doc`` (a config's dict, sub-configs included) is
    deeper than :data:`MAX_LAYERS`, before anything is built."""
    for key, value in doc.items():
        if isinstance(value, dict):
            _check_depth(value, f"{where}{key}.")
        elif key in _DEPTH_FIELDS and isinstance(value, int) and not isinstance(value, bool) and value > MAX_LAYERS:
            raise invalid(f"{where}{key}", f"{value} layers is more than the {MAX_LAYERS} modelinit builds (the deepest "
                          "published models have about 130)", "give the model's real depth")


def build(document: dict[str, Any], architecture: str = "") -> ModelSpec:
    """The spec of ``document`` (a config.json object) as class ``architecture`` (empty: the
    config's ``architectures[0]``, else the family's usual head)."""
    tf = load_transformers()
    config = config_of(document)
    _check_depth(config.to_dict())
    override = bool(architecture)
    if not architecture:
        names = document.get("architectures")
        if names is not None and not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
            raise invalid("architectures", f"must be a non-empty list of class names, got {names!r}", "use e.g. [\"LlamaForCausalLM\"]")
        architecture = names[0] if names else (default_class(config.model_type) or "")
    cls = model_class(config, architecture, "spec.architecture" if override else "spec.config.architectures")
    model = build_meta(cls, config)
    records = record_init(model)  # before tying, as transformers initializes then ties
    with quiet():
        model.tie_weights()
    stored, tied = _stored(tf, model)
    tensors = [_tensor_spec(name, shape, info, records, model) for name, shape, info in list(_hub_layout(tf, model, stored))]
    _check_sizes(tensors)
    try:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
    except ValueError:  # several text configs (MusicGen's encoder and decoder): the top level
        text = config
    n_layers = _int_attr(text, "num_hidden_layers", 1)
    hidden = _int_attr(text, "hidden_size", 0) or _int_attr(text, "d_model", 0) or 1
    std = getattr(text, "initializer_range", None) or 0.02
    out_config = {k: v for k, v in document.items() if k not in DROPPED_KEYS}
    out_config["architectures"] = [architecture]
    return ModelSpec(
        computed=replay_of(architecture, document, tensors),
        family=config.model_type,
        architecture=architecture,
        config=dict(sorted(out_config.items())),
        tensors=tuple(tensors),
        n_layers=n_layers,
        hidden_size=hidden,
        initializer_range=float(std) if isinstance(std, (int, float)) and 0 < std <= 1 else 0.02,
        tied=tied,
        base_model_prefix=_prefix(model),
        transformers_version=tf.__version__,
    )


def _int_attr(obj, name: str, default: int) -> int:
    v = getattr(obj, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default


def _prefix(model) -> str:
    """``base_model_prefix`` when the class wraps its base model under it (a head class), else ''."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    return prefix if prefix and hasattr(model, prefix) and getattr(model, prefix) is not model else ""


def _stored(tf, model) -> tuple[dict[str, Any], dict[str, str]]:
    """The state_dict save_pretrained keeps (tied names dropped), and the dropped names -> kept name."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    full = model.state_dict()
    with quiet():
        kept = remove_tied_weights_from_state_dict(dict(full), model)
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        kept.pop(key, None)
    owner = {id(model.get_parameter_or_buffer(k)): k for k in kept}
    tied = {}
    for name in full:
        if name not in kept:
            target = owner.get(id(model.get_parameter_or_buffer(name)))
            if target is not None:
                tied[name] = target
    return kept, tied


def _hub_layout(tf, model, stored: dict[str, Any]):
    """(disk name, disk shape, ModuleInfo of its in-memory source) in canonical order.

    State_dict order; a tensor that transformers' reverse conversion turns into several (fused
    experts -> one tensor per expert and projection) is replaced in place by its outputs, sorted
    as transformers sorts names (numbers by value)."""
    sources = {name: ModuleInfo.of(model, name) for name in stored}
    try:
        groups = _reverse_conversion(tf, model, stored)
    except Exception as e:  # noqa: BLE001 - sizes the conversion cannot split (e.g. zero experts) are bad input
        raise invalid("", f"transformers cannot lay out {type(model).__name__}'s tensors as the hub does: {one_line(e)}",
                      "fix the sizes it names") from None
    emitted = set()
    for name, tensor in stored.items():
        group = groups.get(name)
        if group is None:
            yield name, tuple(tensor.shape), sources[name]
            continue
        key, outputs = group
        if key in emitted:
            continue
        emitted.add(key)
        for out_name, (shape, srcs) in outputs:
            yield out_name, shape, sources[srcs[0]].for_output(shape, srcs)


def _reverse_conversion(tf, model, stored: dict[str, Any]):
    """Run save_pretrained's reverse weight conversion on meta tensors, keeping which in-memory
    tensor each output comes from. Returns {in-memory name: (group key, [(disk name, (shape, source))])}
    for the tensors it renames or converts; others are stored as they are."""
    from transformers.core_model_loading import apply_converters, apply_renamings, dot_natural_key

    renamings, converters = reverse_conversions(model)
    if not renamings and not converters:
        return {}
    by_pattern = {p: c for c in converters for p in c.source_patterns}
    import copy

    pending: dict[str, tuple[Any, list[str]]] = {}
    renamed: dict[str, str] = {}
    for name in sorted(stored, key=dot_natural_key):
        target, pattern = apply_converters(name, converters)
        if pattern is None:
            new = apply_renamings(name, renamings)
            if new != name:
                renamed[name] = new
            continue
        converter, names = pending.setdefault(target, (copy.deepcopy(by_pattern[pattern]), []))
        converter.add_tensor(target, name, pattern, stored[name])
        names.append(name)
    groups: dict[str, tuple[Any, list]] = {}
    for name, new in renamed.items():
        groups[name] = (name, [(new, (tuple(stored[name].shape), (name,)))])
    for target, (converter, names) in pending.items():
        listed = []
        for out_name, tensor in convert(converter, target, model).items():
            out_name = apply_renamings(out_name, renamings)
            listed.append((out_name, (tuple(tensor.shape), names)))
        listed.sort(key=lambda item: dot_natural_key(item[0]))
        key = f"group:{target}"
        # every output records all the in-memory tensors its converter read: one when it is cut from a
        # single tensor; several (concatenated) must share one rule, which _tensor_spec checks
        resolved = [(n, (shape, tuple(srcs))) for n, (shape, srcs) in listed]
        for name in names:
            groups[name] = (key, resolved)
    return groups


def _tensor_spec(name: str, shape: tuple[int, ...], info: "ModuleInfo", records: dict[str, Record], model) -> TensorSpec:
    recs = [records.get(src) for src in info.sources]
    if math.prod(shape) == 0 and any(r is None for r in recs):  # an empty tensor (no register tokens): no values
        recs = [Record(HfInit("constant", value=0.0, source="empty: no elements"))]
    if len(recs) == 1 and recs[0] is None and weight_norm_dim(model, info.sources[0]) is not None:
        dim = weight_norm_dim(model, info.sources[0])
        over = "all of v" if dim == -1 else f"every dim of v but {dim}"
        recs = [Record(HfInit("computed", source=f"weight_norm: g = ‖v‖ over {over}, v as drawn (the constructor's "
                                                 "torch.nn.utils.parametrizations.weight_norm)"))]
    if any(r is None for r in recs):
        missing = info.sources[recs.index(None)]
        raise ValueError(
            f"spec: transformers' initialization of {model.__class__.__name__} never writes {missing!r} "
            f"(stored as {name!r}); there is no hf-default rule to reproduce, so this architecture is not supported"
        )
    if any(r.refusal for r in recs):
        bad = next(r for r in recs if r.refusal)
        raise ValueError(f"spec: {name!r}: {bad.refusal}; this architecture is not supported")
    if len({r.init for r in recs}) > 1:
        raise ValueError(f"spec: {name!r} is stored from in-memory tensors with different init rules; not supported")
    kind, role, param, layer, fan_in, fan_out, padding_idx = describe(name, shape, info)
    init = recs[0].init
    if init.kind == "computed":
        origin = info.sources[0]
        if len(info.sources) != 1 or tuple(model.get_parameter_or_buffer(origin).shape) != tuple(shape):
            raise ValueError(f"spec: {name!r} is computed by the model's code ({init.source}) and stored converted "
                             f"from {', '.join(info.sources)}; this architecture is not supported")
        init = HfInit(**{**init.__dict__, "origin": origin})
    if init.zero_row and padding_idx is None:
        init = HfInit(**{**init.__dict__, "zero_row": False})
    if padding_idx is not None and not init.zero_row:
        padding_idx = padding_idx  # the module has one; hf-default leaves the row drawn
    return TensorSpec(
        name, tuple(int(d) for d in shape), kind=kind, role=role, param=param, layer=layer,
        fan_in=fan_in, fan_out=fan_out, padding_idx=padding_idx, hf_init=init,
    )


def _check_sizes(tensors: list[TensorSpec]) -> None:
    for t in tensors:
        if any(d > MAX_DIM for d in t.shape):
            raise invalid("", f"tensor {t.name!r} has a dimension above {MAX_DIM}", "use smaller sizes")
        if t.numel > 2**62:
            raise invalid("", f"tensor {t.name!r} is too large ({math.prod(t.shape)} elements)", "use smaller sizes")
