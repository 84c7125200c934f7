"""Translation between the wire messages (modelinit.v1) and the core's dataclasses.

Only shapes data: every check lives in the core's constructors, which raise ValueError with
the field's path; the servicer turns those into INVALID_ARGUMENT.
"""
from __future__ import annotations

from modelinit.v1 import modelinit_pb2 as pb

from . import architectures, explain, layout
from .engine import ALGORITHM_VERSION
from .planner import Plan, Request
from .policies import Distribution, Match, Policy, Rule

_DEPTH = {pb.DEPTH_SCALING_NONE: "none", pb.DEPTH_SCALING_N_LAYERS: "n_layers", pb.DEPTH_SCALING_LAYER: "layer"}


def request_from_pb(msg: pb.ModelRequest) -> Request:
    source = msg.spec.WhichOneof("source")
    if source == "preset":
        model = architectures.from_preset(msg.spec.preset)
    elif source == "config_json":
        model = architectures.from_config(msg.spec.config_json)
    else:
        raise ValueError("spec: missing; give a preset name (e.g. 'bert-base-uncased') or the text of a config.json")
    return Request(
        model=model,
        policy=policy_from_pb(msg.policy),
        seed=msg.seed,
        dtype=msg.dtype or "float32",
        max_shard_size=layout.parse_size(msg.max_shard_size),
    )


def policy_from_pb(msg: pb.Policy) -> Policy:
    return Policy(preset=msg.preset, rules=tuple(_rule_from_pb(i, r) for i, r in enumerate(msg.rules)))


def _rule_from_pb(index: int, msg: pb.Rule) -> Rule:
    name = msg.name or f"rule[{index}]"
    try:
        m = msg.match
        match = Match(
            kinds=tuple(m.kinds),
            roles=tuple(m.roles),
            params=tuple(m.params),
            names=tuple(m.names),
            min_layer=m.min_layer if m.HasField("min_layer") else None,
            max_layer=m.max_layer if m.HasField("max_layer") else None,
        )
        return Rule(match, _distribution_from_pb(msg.init), _DEPTH.get(msg.depth_scaling, "?"), msg.zero_padding_row, name)
    except ValueError as e:
        raise ValueError(f"policy.rules[{index}] ({name}): {e}") from None


def _distribution_from_pb(msg: pb.Distribution) -> Distribution:
    kind = msg.WhichOneof("kind")
    if kind is None:
        raise ValueError("init: missing; set one distribution (normal, trunc_normal, uniform, constant, ...)")
    d = getattr(msg, kind)
    if kind == "normal":
        return Distribution("normal", mean=d.mean, std=d.std)
    if kind == "trunc_normal":
        return Distribution(
            "trunc_normal",
            mean=d.mean,
            std=d.std,
            a=d.a if d.HasField("a") else -2.0,
            b=d.b if d.HasField("b") else 2.0,
            bounds="absolute" if d.bounds == pb.BOUNDS_ABSOLUTE else "sigma",
            preserve_std=d.preserve_std,
        )
    if kind == "uniform":
        return Distribution("uniform", low=d.low, high=d.high)
    if kind == "constant":
        return Distribution("constant", value=d.value)
    if kind == "lecun_normal":
        return Distribution("kaiming_normal", mode="fan_in", nonlinearity="linear")
    return Distribution(
        kind,
        gain=d.gain if d.HasField("gain") else 1.0,
        negative_slope=d.negative_slope,
        mode=d.mode or "fan_in",
        nonlinearity=d.nonlinearity or "leaky_relu",
    )


def plan_to_pb(plan: Plan, request: pb.ModelRequest) -> pb.PlanResponse:
    r = plan.request
    echo = pb.ModelRequest()
    echo.CopyFrom(request)
    echo.dtype = r.dtype
    echo.max_shard_size = str(r.max_shard_size)
    if not echo.policy.preset and not echo.policy.rules:
        echo.policy.preset = "hf-default"
    out = pb.PlanResponse(
        algorithm_version=ALGORITHM_VERSION,
        fingerprint=plan.fingerprint,
        request=echo,
        family=r.model.family,
        architecture=r.model.architecture,
        total_params=plan.total_params,
        total_bytes=plan.total_bytes,
        tied=dict(r.model.tied),
    )
    for t in plan.tensors:
        s, res = t.spec, t.resolved
        tp = out.tensors.add(
            name=s.name,
            shape=s.shape,
            dtype=r.dtype,
            kind=s.kind,
            role=s.role,
            param=s.param,
            fan_in=s.fan_in,
            fan_out=s.fan_out,
            rule=res.rule,
            init=res.init,
            std=res.std,
            effective_std=res.effective_std,
            shard=t.file,
            offset=t.offset,
            nbytes=t.nbytes,
        )
        if s.layer is not None:
            tp.layer = s.layer
        if res.sampler.zero_row is not None:
            tp.padding_idx = res.sampler.zero_row
    for f in plan.files:
        out.files.add(name=f.name, size=f.size, shard=f.shard, tensors=len(f.tensors))
    out.groups.extend(_group_to_pb(g) for g in explain.explain(plan))
    return out


def _group_to_pb(g: explain.Group) -> pb.TensorGroup:
    # Every Group field has a TensorGroup field of the same name (tuples become repeated fields).
    return pb.TensorGroup(**{f: getattr(g, f) for f in explain.Group.__dataclass_fields__})

