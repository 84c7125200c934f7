"""Plans of recent requests, kept so that a request planned once is not planned again.

A plan is a function of the request. Most of its cost is not a function of the seed: the spec
(a transformers class built on the meta device, or read from the spec cache) and every tensor's
rule and sampler (the policy resolved over, for DeepSeek-V3, 45,395 tensors: about 2.5 s of a
3.7 s plan on 2 cores). The seed decides only the Philox keys, the fingerprint and computed
tensors' draws. So two caches, both small LRUs: whole plans by request, and (request, resolution)
by request without its seed, from which a new seed's plan is built without resolving again.
Both the gRPC servicer and the embedded service plan through one :class:`PlanCache`.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Callable

from modelinit_wire.v1 import modelinit_pb2 as pb

from ..core import planner
from ..core.planner import Plan, Request
from ..messages import request_from_pb

#: Whole plans kept for the next call of the same request (a client paging through a Plan, then
#: Init; a retry or resume): a 90,000-tensor plan takes seconds to build and some 100 MB to hold.
PLANS = 2
#: Requests without their seed kept with their resolution: a sweep over seeds of one model.
RESOLUTIONS = 2


class PlanCache:
    """:meth:`build` a request's plan, from what recent requests left. Thread-safe (the servicer
    builds on executor threads); two threads missing at once both build (the same plan)."""

    def __init__(self, plans: int = PLANS, resolutions: int = RESOLUTIONS) -> None:
        self._lock = threading.Lock()
        self._plans: collections.OrderedDict[bytes, Plan] = collections.OrderedDict()
        self._bases: collections.OrderedDict[bytes, tuple[Request, list[Any]]] = collections.OrderedDict()
        self._sizes = (plans, resolutions)

    def cached(self, msg: pb.ModelRequest) -> Plan | None:
        """The plan of ``msg`` if it is kept (built and checked before), else None."""
        return self._get(self._plans, msg.SerializeToString(deterministic=True))

    def build(self, msg: pb.ModelRequest, check: Callable[[Plan], None] | None = None) -> Plan:
        """The plan of ``msg``, kept once ``check`` (the server's limits) passed it. ValueError,
        field-named, for a bad request or one ``check`` refuses; nothing is kept then."""
        key = msg.SerializeToString(deterministic=True)
        plan = self._get(self._plans, key)
        if plan is not None:
            return plan
        unseeded = pb.ModelRequest()
        unseeded.CopyFrom(msg)
        unseeded.seed = 0
        base_key = unseeded.SerializeToString(deterministic=True)
        base = self._get(self._bases, base_key)
        if base is None:
            request = request_from_pb(msg)
            base = (request, planner.resolve(request.policy, request.model))
            self._put(self._bases, base_key, base, self._sizes[1])
        else:
            request = dataclasses.replace(base[0], seed=msg.seed)  # validated again (the seed's range)
        plan = planner.build_plan(request, base[1])
        if check is not None:
            check(plan)
        self._put(self._plans, key, plan, self._sizes[0])
        return plan

    def _get(self, cache: collections.OrderedDict, key: bytes) -> Any:
        with self._lock:
            if key not in cache:
                return None
            cache.move_to_end(key)
            return cache[key]

    def _put(self, cache: collections.OrderedDict, key: bytes, value: Any, size: int) -> None:
        with self._lock:
            cache[key] = value
            while len(cache) > size:
                cache.popitem(last=False)
