"""Requests whose bytes are not a valid message get INVALID_ARGUMENT, not UNKNOWN.

gRPC parses the request before the servicer runs, and a parse error surfaces as UNKNOWN with a
server-side traceback. This interceptor gives modelinit's methods a parser that hands the
servicer a marker instead of raising, and answers the marker with INVALID_ARGUMENT.
"""
from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from .observability import Metrics, method_label

PREFIX = "/modelinit.v1.ModelInit/"


@dataclass(frozen=True)
class _Malformed:
    error: str


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(PREFIX) or handler.request_streaming:
            return handler
        parse = handler.request_deserializer
        metrics = self._metrics
        method = details.method

        def lenient(data: bytes):
            try:
                return parse(data)
            except DecodeError as e:
                return _Malformed(str(e))

        def guard(behaviour):
            async def run(request, context):
                if isinstance(request, _Malformed):
                    metrics.rejected("invalid_argument")
                    metrics.observe_request(method_label(method), grpc.StatusCode.INVALID_ARGUMENT, 0.0)
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"request: not a valid message for {method} ({request.error}); build it with the modelinit.v1 proto",
                    )
                return await behaviour(request, context)

            return run

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                guard(handler.unary_stream), request_deserializer=lenient, response_serializer=handler.response_serializer
            )
        return grpc.unary_unary_rpc_method_handler(
            guard(handler.unary_unary), request_deserializer=lenient, response_serializer=handler.response_serializer
        )
