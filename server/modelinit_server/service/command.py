"""``modelinit serve``: the server side of the command line (``modelinit.cli`` parses the
arguments and hands them here, through ``modelinit.server_extra``)."""
from __future__ import annotations

import argparse
from typing import Callable

from .limits import Limits
from .observability import configure_logging
from .server import ServerConfig
from .server import serve as run_server
from .servicer import StreamPolicy


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig of ``modelinit serve ARGS`` (ValueError naming the bad flag)."""
    return ServerConfig(
        host=args.host, port=args.port, device=args.device, workers=args.workers, grace=args.grace,
        shutdown_delay=args.shutdown_delay,
        limits=Limits(max_params=args.max_params, max_dim=args.max_dim, max_rank=args.max_rank,
                      max_tensors=args.max_tensors, max_request_bytes=args.max_request_bytes),
        streams=StreamPolicy(max_streams=args.max_streams, idle_timeout=args.idle_timeout),
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, token=args.token or None,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, reflection=args.reflection,
    )


def serve(args: argparse.Namespace, fail: Callable[[str, int], int]) -> int:
    """Run the server until it stops; the exit status (``fail(message, code)`` reports an error:
    2 for a bad flag or device, 1 for the environment, e.g. a busy port)."""
    try:
        config = server_config(args)
        configure_logging(args.log_format, args.log_level)
    except ValueError as e:
        return fail(str(e), 2)
    try:
        run_server(config, ready=lambda line: print(line, flush=True))
    except ValueError as e:  # e.g. the device's engine is not available
        return fail(str(e), 2)
    except OSError as e:
        return fail(str(e), 1)
    return 0
