"""What the client package takes from the server package besides the embedded mode: the ``serve``
command, ``modelinit.init_module_`` and the probe (``modelinit.probe``, ``modelinit probe``).

Like :mod:`modelinit.sources.embedded`, it imports ``modelinit_server`` only inside functions, so
``import modelinit`` never needs the server extra; the import-linter contracts in pyproject.toml
allow these imports here and nowhere else.
"""
from __future__ import annotations

import argparse
from typing import Callable

import grpc
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError

#: How an error tells which extra to install (docs/install.md): one way, from a clone or a wheel.
_EXTRA = "install modelinit with the '{extra}' extra (from a clone: pip install -e '.[{extra}]'; docs/install.md)"


def serve(args: argparse.Namespace, fail: Callable[[str, int], int]) -> int:
    """``modelinit serve ARGS``; its exit status (``fail(message, code)`` reports an error)."""
    try:
        from modelinit_server.service.command import serve as run
    except ImportError as e:
        return fail(f"serving needs the server extra ({e}); {_EXTRA.format(extra='server')}", 1)
    return run(args, fail)


def init_module_():
    """``modelinit_server.training.init_module_`` (needs torch and the server extra), for
    ``modelinit.init_module_``."""
    from modelinit_server.training import init_module_ as fill

    return fill


def probe(requests: list[pb.ModelRequest], labels: list[str], **options) -> list:
    """``modelinit_server.probe.probe`` of the requests (the pass needs the server extra only)."""
    return _run_probe("probe", requests, labels, options)


def coord_check(requests: list[pb.ModelRequest], labels: list[str], **options) -> list:
    """``modelinit_server.probe.coord_check`` of the requests (the coordinate check; the server extra only)."""
    return _run_probe("coord_check", requests, labels, options)


def _run_probe(name: str, requests: list[pb.ModelRequest], labels: list[str], options: dict) -> list:
    """``modelinit_server.probe.<name>`` of the requests, its ValueError (a spec, policy, width,
    step count or budget it cannot take: one line naming it) as INVALID_ARGUMENT."""
    try:
        from modelinit_server import probe as probing
        from modelinit_server.messages import request_from_pb
    except ImportError as e:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"the probe needs the server extra ({e}); "
                             f"{_EXTRA.format(extra='server')}") from None
    try:
        return getattr(probing, name)([request_from_pb(r) for r in requests], labels, **options)
    except ValueError as e:
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None


def coord_report(table: bool = True, plot: bool = False):
    """The report module and the coordinate check's JSON writer (``probe_report``'s needs)."""
    report, _ = probe_report(table=table, plot=plot)
    from modelinit_server.probe import coord_to_json

    return report, coord_to_json


def probe_report(table: bool = True, plot: bool = False):
    """The probe's report module (table, plot) and its JSON writer. The table needs rich and the
    plot matplotlib (the probe extra); JSON alone needs neither."""
    needs = [("rich", "the probe's table", "or give --json - for JSON alone")] if table else []
    needs += [("matplotlib", "--plot", "or leave --plot out")] if plot else []
    for module, what, instead in needs:
        try:
            __import__(module)
        except ImportError as e:
            raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"{what} needs {module} ({e}); {_EXTRA.format(extra='probe')}, {instead}") from None
    try:
        from modelinit_server.probe import report, to_json
    except ImportError as e:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"the probe needs the server extra ({e}); "
                             f"{_EXTRA.format(extra='server')}") from None
    return report, to_json
