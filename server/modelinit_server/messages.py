"""Translation between the wire messages (modelinit.v1) and the core's dataclasses.

It shapes data and resolves the spec a message names (a preset or a config.json, through
``architectures``) into the core's ``ModelSpec``; every check lives in the core's and the
architectures' constructors, which raise ValueError with the field's path; the servicer turns
those into INVALID_ARGUMENT.
"""
from __future__ import annotations

import hashlib

from modelinit_wire.constants import EXCERPT
from modelinit_wire.v1 import modelinit_pb2 as pb

from . import architectures
from .core import explain, layout
from .core.planner import Plan, Request
from .core.policies import Distribution, Match, Policy, Rule
from .engine import ALGORITHM_VERSION

_DEPTH = {pb.DEPTH_SCALING_NONE: "none", pb.DEPTH_SCALING_N_LAYERS: "n_layers", pb.DEPTH_SCALING_LAYER: "layer"}


def request_from_pb(msg: pb.ModelRequest) -> Request:
    source = msg.spec.WhichOneof("source")
    if source == "preset":
        model = architectures.from_preset(msg.spec.preset, msg.spec.architecture)
    elif source == "config_json":
        model = architectures.from_config(msg.spec.config_json, msg.spec.architecture)
    else:
        raise ValueError("spec: missing; give a preset name (e.g. 'bert-base-uncased') or the text of a config.json")
    return Request(
        model=model,
        policy=policy_from_pb(msg.policy),
        seed=msg.seed,
        dtype=msg.dtype or "float32",
        max_shard_size=layout.parse_size(msg.max_shard_size),
        algorithm_version=msg.algorithm_version or ALGORITHM_VERSION,  # 0: the newest
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
        shown = name if len(name) <= EXCERPT else name[: EXCERPT - 3] + "..."
        raise ValueError(f"policy.rules[{index}] ({shown}): {e}") from None


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


def plan_to_pb(plan: Plan, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
    """The plan as a PlanResponse listing the tensors of one page (``page_size`` from
    ``page_token`` on; 0: none, a summary). Files, groups and totals are always complete.
    ValueError (naming page_size or page_token) for a page that cannot be served."""
    check_page_size(page_size)
    start = page_start(plan, page_token)
    stop = min(start + page_size, len(plan.tensors))
    r = plan.request
    echo = pb.ModelRequest()
    echo.CopyFrom(request)
    echo.dtype = r.dtype
    echo.max_shard_size = str(r.max_shard_size)
    echo.algorithm_version = r.algorithm_version
    if not echo.policy.preset and not echo.policy.rules:
        echo.policy.preset = "hf-default"
    out = pb.PlanResponse(
        algorithm_version=r.algorithm_version,
        fingerprint=plan.fingerprint,
        request=echo,
        family=r.model.family,
        architecture=r.model.architecture,
        total_params=plan.total_params,
        total_bytes=plan.total_bytes,
        tied=dict(r.model.tied),
        base_model_prefix=r.model.base_model_prefix,
        transformers_version=r.model.transformers_version,
    )
    out.tensor_count = len(plan.tensors)
    if page_size and stop < len(plan.tensors):
        out.next_page_token = _page_token(plan, stop)
    for t in plan.tensors[start:stop]:
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


#: Most tensors one Plan lists (PlanRequest.page_size): ~2 MB of TensorPlans, well under gRPC's
#: 4 MiB default receive limit.
MAX_PAGE_SIZE = 10_000


def check_page_size(page_size: int) -> None:
    if not 0 <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: at most {MAX_PAGE_SIZE} tensors per page, got {page_size}; "
                         "page through with next_page_token (0: a summary without tensors)")


def _page_check(plan: Plan, offset: int) -> str:
    # Binds a token to its plan (fingerprint: seed, dtype, algorithm version, every tensor; the
    # shard size, which moves shards and offsets) and to its offset. Stateless, so any replica of
    # the same version accepts a token another one issued.
    doc = f"modelinit-page\0{plan.fingerprint}\0{plan.request.max_shard_size}\0{offset}"
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _page_token(plan: Plan, offset: int) -> str:
    """``"<offset>.<check>"``: the index of the page's first tensor and 16 hex digits of
    SHA-256 over the plan's identity and that offset."""
    return f"{offset}.{_page_check(plan, offset)}"


def page_start(plan: Plan, token: str) -> int:
    """The index of the first tensor of the page ``token`` names (0 for an empty token)."""
    if not token:
        return 0
    offset, _, check = token.partition(".")
    if (len(token) <= 64 and offset.isascii() and offset.isdigit() and 0 < int(offset) < len(plan.tensors)
            and check == _page_check(plan, int(offset))):
        return int(offset)
    shown = token if len(token) <= 40 else token[:40] + "..."
    raise ValueError(f"page_token: {shown!r} is not a page of this request; pass the next_page_token of a Plan of "
                     "this same request, or empty")


def _group_to_pb(g: explain.Group) -> pb.TensorGroup:
    # Every Group field has a TensorGroup field of the same name (tuples become repeated fields).
    return pb.TensorGroup(**{f: getattr(g, f) for f in explain.Group.__dataclass_fields__})

