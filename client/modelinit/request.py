"""The request message from what a caller gives: a spec (preset, config path or dict), a policy
(preset, policy file, dict), a seed and the output options."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Union

import grpc
from modelinit_wire import policy_file
from modelinit_wire.spec_argument import Preset, read_spec_argument
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError

Spec = Union[str, os.PathLike, Mapping[str, Any], pb.ModelSpec]
PolicyArg = Union[str, os.PathLike, Mapping[str, Any], None, pb.Policy]


def model_spec(spec: Spec) -> pb.ModelSpec:
    """A preset name, a path to a config.json (or a folder holding one), or a config dict
    (``modelinit_wire.spec_argument``, the rule ``init_module_`` follows too), or the message."""
    if isinstance(spec, pb.ModelSpec):
        return spec
    try:
        named = read_spec_argument(spec)
    except ValueError as e:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
    if isinstance(named, Preset):
        return pb.ModelSpec(preset=named.name)
    document = named.document
    return pb.ModelSpec(config_json=document if isinstance(document, str) else json.dumps(document))


def model_policy(policy: PolicyArg) -> pb.Policy:
    """None (hf-default), a preset name, a path to a JSON/YAML policy file, a policy dict, or the message."""
    try:
        return policy_file.from_arg(policy)
    except ValueError as e:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None


@dataclass(frozen=True)
class RequestOptions:
    """Everything a request asks for besides the spec, defined once: the client's methods
    (``plan``, ``tensors``, ``init_model``), the CLI and the probe build their requests from it.
    Checked at construction (INVALID_ARGUMENT naming the field)."""

    seed: int = 0
    """The seed, ``0 <= seed < 2**64``: with the spec, the policy and the algorithm version, it
    decides every byte."""
    policy: PolicyArg = None
    """None (hf-default: what transformers does for the family), a preset name (``bert-tf``,
    ``gpt2``, ...), a path to a JSON/YAML policy file, a policy dict, or the message."""
    dtype: str | None = None
    """The output dtype: ``float32``, ``bfloat16`` or ``float16``; None: float32."""
    max_shard_size: str | int | None = None
    """The largest shard, as ``save_pretrained`` takes it (``"5GB"``, ``"500MB"``, or bytes);
    None: 5GB."""
    algorithm_version: int | None = None
    """The generation algorithm's version (1, 2); None or 0: the newest. An older one reproduces
    the weights a run of that version wrote."""
    architecture: str | None = None
    """A transformers model class of the spec's family (``"BertModel"``) overriding the spec's own
    (``config.architectures[0]``); None: the spec's."""

    def __post_init__(self) -> None:
        seed, version = self.seed, self.algorithm_version
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"seed: must be an integer in [0, 2^64), got {seed!r}")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or not 0 <= version < 2**32):
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"algorithm_version: must be a version number (1, 2; 0 or None: the newest), got {version!r}")
        if self.architecture is not None and not isinstance(self.architecture, str):
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"architecture: must be a class name, got {self.architecture!r}")

    def keywords(self) -> dict[str, Any]:
        """The fields as keyword arguments (of ``Client.plan``, ``init_model``, ...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def request(self, spec: Spec) -> pb.ModelRequest:
        """The request message for ``spec`` (a preset, a config path or dict, or the message)."""
        msg = pb.ModelRequest(
            spec=model_spec(spec),
            policy=model_policy(self.policy),
            seed=self.seed,
            dtype=self.dtype or "",
            max_shard_size="" if self.max_shard_size is None else str(self.max_shard_size),
            algorithm_version=self.algorithm_version or 0,
        )
        if self.architecture:
            msg.spec.architecture = self.architecture
        return msg


def model_request(spec: Spec, **options: Any) -> pb.ModelRequest:
    """The request message: ``RequestOptions(**options).request(spec)`` (``seed`` is required)."""
    if "seed" not in options:
        raise TypeError("model_request() needs seed=")
    return RequestOptions(**options).request(spec)
