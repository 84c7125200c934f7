"""What a gRPC caller sends: a PlanRequest, InitRequest or TensorsRequest (its spec: a preset name or a
config.json's text; its policy, seed, dtype, sizes, files, offsets, slices, chunk and page sizes), as
bytes, handed to the real servicer the way gRPC does (parsed by the malformed-request interceptor's
rule, then the method), with a stand-in for the call's context; and a config.json's text alone, as the
architectures read it.

Contract: a request the servicer takes streams its first message (the harness stops there), or the
call is aborted with INVALID_ARGUMENT, OUT_OF_RANGE or RESOURCE_EXHAUSTED and a message; bytes that
are no message are INVALID_ARGUMENT (the interceptor). Never UNKNOWN (an exception escaping the
servicer) and never any other status. A config's text gives a spec or a ValueError."""
from __future__ import annotations

import asyncio

from .base import Reader, Target

_STATE: dict[str, object] = {}
ALLOWED = ("INVALID_ARGUMENT", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED")


class _Aborted(Exception):
    def __init__(self, code, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details = code, details


class _Context:
    """What the servicer asks of a grpc.aio call: abort raises, a write ends the call after the first
    message (the harness checks validation, not a whole model's bytes)."""

    def __init__(self) -> None:
        self.status = None
        self.written = 0

    def invocation_metadata(self):
        return ()

    async def send_initial_metadata(self, metadata) -> None:
        pass

    def set_code(self, code) -> None:
        self.status = code

    def set_details(self, details: str) -> None:
        pass

    def code(self):
        return self.status

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def abort(self, code, details: str):
        raise _Aborted(code, details)

    async def write(self, message) -> None:
        self.written += 1
        raise ConnectionResetError("the harness read one message")


def _setup() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from modelinit_server.engine.backends import select
    from modelinit_server.service.servicer import ModelInitServicer

    if "servicer" not in _STATE:
        _STATE["servicer"] = ModelInitServicer(select("reference"), ThreadPoolExecutor(1))
        _STATE["loop"] = asyncio.new_event_loop()
        _setup_config()


def request(data: bytes) -> None:
    import grpc
    from google.protobuf.message import DecodeError
    from modelinit_wire.v1 import modelinit_pb2 as pb

    _setup()
    r = Reader(data)
    method, message = r.choice([("Plan", pb.PlanRequest), ("Init", pb.InitRequest), ("Tensors", pb.TensorsRequest)])
    try:
        msg = message.FromString(r.rest())
    except DecodeError:
        return  # the interceptor answers INVALID_ARGUMENT (tests/server/service test it on the wire)
    servicer, loop, context = _STATE["servicer"], _STATE["loop"], _Context()
    try:
        loop.run_until_complete(getattr(servicer, method)(msg, context))  # type: ignore[attr-defined]
    except _Aborted as e:
        assert e.code.name in ALLOWED and e.details, f"{method} aborted with {e.code.name}: {e.details}"
        return
    code = context.code()
    assert code in (None, grpc.StatusCode.OK, grpc.StatusCode.CANCELLED), f"{method} ended with {code}"


def config(data: bytes) -> None:
    from modelinit_server.architectures import from_config

    r = Reader(data)
    architecture = r.choice(["", "", "LlamaForCausalLM", "BertModel", "NoSuchModel"])
    try:
        from_config(r.text(), architecture)
    except ValueError:
        pass


def _setup_config() -> None:
    """transformers imported and a model built once, so that the first inputs' time (the per-input
    timeout's) is theirs, not the imports'."""
    from modelinit_server.architectures import from_config

    from_config({"model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "intermediate_size": 32})


SERVICE_TARGETS = (
    Target("request", "the first message streamed, or INVALID_ARGUMENT / OUT_OF_RANGE / RESOURCE_EXHAUSTED; never "
                      "UNKNOWN", request, _setup, max_len=8192),
    Target("config", "a spec, or ValueError naming the field", config, _setup_config, max_len=8192),
)
