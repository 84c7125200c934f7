"""The in-process side: the embedded engine as a :class:`~modelinit.source.Source`, and the rest
the client package takes from the server package (the algorithm versions it makes, the
``serve`` command).

This is the one module of the client package that imports ``modelinit_server``, and only inside
functions, so ``import modelinit`` never needs the server extra (numpy, numba, torch): the
import-linter contracts in pyproject.toml allow these imports here and nowhere else.
"""
from __future__ import annotations

import argparse
from typing import Callable, Iterable, Iterator

import grpc

from .errors import ModelInitError
from .source import Events, check_version
from .v1 import modelinit_pb2 as pb


class LocalSource:
    """The server's own planner, engine and file producer (``modelinit_server.local.LocalEngine``),
    in-process, without the gRPC hop: the same bytes. ``device``: ``auto``, ``cpu``, ``cuda``,
    ``reference``. FAILED_PRECONDITION when the server extra is not installed."""

    def __init__(self, device: str = "auto") -> None:
        try:
            from modelinit_server.local import LocalEngine
        except ImportError as e:
            raise ModelInitError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"embedded mode needs the server extra ({e}); pip install 'modelinit[server]' or pass a server target",
            ) from None
        try:
            self.engine = LocalEngine(device)
        except ValueError as e:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def plan(self, request: pb.ModelRequest, page_size: int = 0, page_token: str = "") -> pb.PlanResponse:
        try:
            return check_version(request, self.engine.plan(request, page_size, page_token))
        except ValueError as e:  # the same field-named message the server sends
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def events(self, request: pb.ModelRequest, plan: pb.PlanResponse, files: Iterable[int] | None = None) -> Events:
        """The engine's events (no producer-side SHA-256: the writer's own hash is the check)."""
        try:
            return self.engine.events(request) if files is None else self.engine.events(request, files)
        except ValueError as e:  # e.g. the requested device's engine is unavailable
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    def tensors(self, request: pb.TensorsRequest) -> Iterator[pb.TensorsResponse]:
        """The engine's Tensors stream (the server's own code, in-process)."""
        try:
            stream = self.engine.tensors(request)
        except IndexError as e:  # a resume point past the end (slices.OutOfRange), as the server says it
            raise ModelInitError(grpc.StatusCode.OUT_OF_RANGE, str(e)) from None
        except ValueError as e:  # the same field-named message the server sends
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        return stream

    def close(self) -> None:
        pass


def algorithm_versions() -> tuple[tuple[int, ...], int] | None:
    """The algorithm versions the installed engine makes and its default; None without the
    server extra."""
    try:
        from modelinit_server.engine import ALGORITHM_VERSION, ALGORITHM_VERSIONS
    except ImportError:
        return None
    return tuple(ALGORITHM_VERSIONS), ALGORITHM_VERSION


def server_config(args: argparse.Namespace):
    """The ServerConfig of ``modelinit serve ARGS`` (ValueError naming the bad flag)."""
    from modelinit_server.command import server_config as build

    return build(args)


def serve(args: argparse.Namespace, fail: Callable[[str, int], int]) -> int:
    """``modelinit serve ARGS``; its exit status (``fail(message, code)`` reports an error)."""
    try:
        from modelinit_server.command import serve as run
    except ImportError as e:
        return fail(f"serving needs the server extra ({e}); pip install 'modelinit[server]'", 1)
    return run(args, fail)
