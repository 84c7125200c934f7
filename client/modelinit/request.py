"""The request message from what a caller gives: a spec (preset, config path or dict), a policy
(preset, policy file, dict), a seed and the output options."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping, Union

import grpc
from modelinit_wire import policy_file
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError

Spec = Union[str, os.PathLike, Mapping[str, Any], pb.ModelSpec]
PolicyArg = Union[str, os.PathLike, Mapping[str, Any], None, pb.Policy]


def model_spec(spec: Spec) -> pb.ModelSpec:
    """A preset name, a path to a config.json (or a folder holding one), or a config dict."""
    if isinstance(spec, pb.ModelSpec):
        return spec
    if isinstance(spec, Mapping):
        return pb.ModelSpec(config_json=json.dumps(dict(spec)))
    path = pathlib.Path(spec)
    if isinstance(spec, os.PathLike) or path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        try:
            return pb.ModelSpec(config_json=path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"spec: cannot read config file {str(path)!r}: {e}") from None
    return pb.ModelSpec(preset=str(spec))


def model_policy(policy: PolicyArg) -> pb.Policy:
    """None (hf-default), a preset name, a path to a JSON/YAML policy file, a policy dict, or the message."""
    try:
        return policy_file.from_arg(policy)
    except ValueError as e:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None


def model_request(
    spec: Spec,
    *,
    seed: int,
    policy: PolicyArg = None,
    dtype: str | None = None,
    max_shard_size: str | int | None = None,
    algorithm_version: int | None = None,
    architecture: str | None = None,
) -> pb.ModelRequest:
    """The request message. ``algorithm_version`` None (or 0) asks for the server's newest;
    ``architecture`` (a model class name, e.g. ``"BertModel"``) overrides the spec's class."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"seed: must be an integer in [0, 2^64), got {seed!r}")
    if algorithm_version is not None and (
        isinstance(algorithm_version, bool) or not isinstance(algorithm_version, int) or not 0 <= algorithm_version < 2**32
    ):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                             f"algorithm_version: must be a version number (1, 2; 0 or None: the newest), got {algorithm_version!r}")
    if architecture is not None and not isinstance(architecture, str):
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, f"architecture: must be a class name, got {architecture!r}")
    msg = pb.ModelRequest(
        spec=model_spec(spec),
        policy=model_policy(policy),
        seed=seed,
        dtype=dtype or "",
        max_shard_size="" if max_shard_size is None else str(max_shard_size),
        algorithm_version=algorithm_version or 0,
    )
    if architecture:
        msg.spec.architecture = architecture
    return msg
