"""The one door to transformers: its model classes, built from a config document on the meta device.

Every module that needs a transformers model goes through here: :mod:`.hf` (a spec from the
model's own init), :mod:`.computed` (the replay of computed tensors), the probe (a real model to
run) and ``init_module_``'s layouts (where a class stores its tensors). A model is built on the
meta device (no memory, milliseconds), with transformers' warnings silenced and what its
constructor writes recorded (:func:`~.constructor.constructor_records`, read by the recording).
Bad input (an unknown model type, a config the class refuses) is a ``ValueError`` naming the
field.

transformers (and torch) are imported only when a function here is called.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Any

from modelinit_wire import releases

from ._fields import DROPPED_KEYS, decode_special_floats, invalid
from .constructor import constructor_records
from .recorder import clear_init_flags

__all__ = ["DEFAULT_CLASS_MAPPINGS", "build_meta", "classes_for", "clear_init_flags", "config_of", "default_class",
           "load_transformers", "meta_model", "model_class", "one_line", "quiet", "transformers_version"]

#: Auto mappings tried, in order, for the class of a config without ``architectures``.
DEFAULT_CLASS_MAPPINGS = (
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
)


def transformers_version() -> str:
    """The installed transformers version, without importing it; empty when it is missing."""
    return releases.installed("transformers") or ""


def load_transformers():
    """The transformers module (torch imported first); a ``ValueError`` for the spec when it is missing
    or it or torch is below modelinit's floor (``modelinit_wire.releases``)."""
    low = releases.below("torch", "transformers")
    if low is not None:
        raise ValueError(f"spec: this architecture is built by transformers on the server, where {low}")
    try:
        with quiet():
            import torch  # noqa: F401
            import transformers
    except ImportError as e:
        raise ValueError(
            f"spec: this architecture needs transformers on the server ({e}); install modelinit with the 'server' extra (docs/install.md)"
        ) from None
    from transformers.utils import is_torch_available

    if not is_torch_available():  # transformers 5 builds no torch model below its torch floor (2.6): say so, by version
        raise ValueError(
            f"spec: transformers {transformers.__version__} builds no model with torch {torch.__version__} (it disables "
            "PyTorch below 2.6); install torch >= 2.6 on the server (docs/install.md)"
        )
    return transformers


@contextlib.contextmanager
def quiet():
    """transformers warns about configs on stderr and through logging; a plan is not the place."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def classes_for(model_type: str) -> list[str]:
    """The model classes transformers has for ``model_type`` (heads and base), sorted."""
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attr in dir(modeling_auto):
        mapping = getattr(modeling_auto, attr)
        if attr.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            value = mapping.get(model_type)
            for v in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(v, str):
                    names.add(v)
    tf = load_transformers()
    return sorted(n for n in names if _model_class(tf, n) is not None)


def _model_class(tf, name: str):
    try:
        cls = getattr(tf, name, None)
    except Exception:  # a lazily imported class whose module needs something missing
        return None
    return cls if isinstance(cls, type) and issubclass(cls, tf.PreTrainedModel) else None


def default_class(model_type: str) -> str | None:
    """The usual head of a family: masked LM, seq2seq LM, causal LM, image classification, base."""
    from transformers.models.auto import modeling_auto

    for attr in DEFAULT_CLASS_MAPPINGS:
        name = getattr(modeling_auto, attr).get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0] if name else None
        if name:
            return name
    return None


def config_of(document: dict[str, Any]):
    """The config object of ``document`` (a config.json object), read by its model type's config class."""
    tf = load_transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = document.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise invalid("model_type", f"missing or not a string ({model_type!r})", "set the HF model_type, e.g. \"llama\"")
    if model_type not in CONFIG_MAPPING:
        raise invalid(
            "model_type",
            f"unsupported model type {model_type!r}: transformers {tf.__version__} does not know it",
            "use a model_type transformers has (e.g. llama, mixtral, bert, t5, vit); custom-code models are not run",
        )
    fields = decode_special_floats({k: v for k, v in document.items() if k not in DROPPED_KEYS and k != "auto_map"})
    try:
        with quiet():
            return CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as e:  # noqa: BLE001 - whatever the config class raises is about the document
        raise invalid("", f"transformers rejects this {model_type} config: {one_line(e)}", "fix the field it names") from None


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 300 else text[:297] + "..."


def model_class(config, architecture: str, field: str = "spec.architecture"):
    """The transformers class named ``architecture``, when it is one of ``config``'s model type;
    a ``ValueError`` naming ``field`` and the classes there are otherwise."""
    classes = classes_for(config.model_type)
    cls = _model_class(load_transformers(), architecture)
    if cls is None or architecture not in classes:
        raise ValueError(
            f"{field}: {architecture!r} is not a transformers class of model_type {config.model_type!r}; "
            f"use one of: {', '.join(classes)}"
        )
    return cls


def build_meta(cls, config, *, tie: bool = False):
    """``cls(config)`` on the meta device, its weights untied (as transformers initializes them;
    ``tie``: tied afterwards, as a loaded model holds them), what its constructor writes recorded
    for the recording."""
    import torch
    from transformers.initialization import no_tie_weights

    try:
        with quiet(), torch.device("meta"), no_tie_weights(), constructor_records() as constructed:
            model = cls(config)
        model._modelinit_constructed = constructed  # for record_init: what the constructor writes
    except Exception as e:  # noqa: BLE001 - a model class that cannot be built from the config is bad input
        raise invalid(
            "", f"transformers cannot build {cls.__name__} from this config: {one_line(e)}", "fix the sizes it names"
        ) from None
    if tie:
        with quiet():
            model.tie_weights()
    return model


def meta_model(document: dict[str, Any], architecture: "str | type", *, tie: bool = False,
               attention: str | None = None, field: str = "spec.architecture"):
    """The model of ``document`` (a config.json object) as ``architecture`` (a class name of its
    model type, or the class), built on the meta device by :func:`build_meta`; ``attention``
    sets the config's attention implementation first (``"eager"``: attention weights a caller
    can read). Bad input is a ``ValueError`` naming the field."""
    config = config_of(document)
    if attention is not None:
        config._attn_implementation = attention
    cls = model_class(config, architecture, field) if isinstance(architecture, str) else architecture
    return build_meta(cls, config, tie=tie)
