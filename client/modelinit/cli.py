"""The `modelinit` command line: serve, init, plan, explain.

Without --server, init, plan and explain run embedded: an in-process server on the same code path.
Errors print one line (`modelinit: error: ...`) and exit non-zero (2 for bad input).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "reference")
ALGORITHM_VERSIONS = (1, 2)  # what --algorithm-version accepts (docs/determinism.md)


def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="preset name (e.g. bert-base-uncased) or path to an HF config.json")
    p.add_argument("--seed", type=int, default=0, help="seed, 0 <= seed < 2^64 (default 0)")
    p.add_argument("--policy", default=None, metavar="P",
                   help="init policy: a preset (hf-default, the default; bert-tf, gpt2, megatron, torchtitan-llama3, xavier, "
                        "kaiming, small-init, torch-trunc-normal) or a JSON/YAML policy file")
    p.add_argument("--dtype", default="float32", help=f"output dtype: {', '.join(DTYPES)} (default float32)")
    p.add_argument("--max-shard-size", default="5GB", help="largest shard, e.g. 5GB (10^9 bytes), 500MB, 2GiB (default 5GB)")
    p.add_argument("--architecture", default=None, metavar="CLASS",
                   help="model class overriding the spec's architectures[0], e.g. BertModel, LlamaForCausalLM")
    p.add_argument("--algorithm-version", type=int, default=None, choices=ALGORITHM_VERSIONS, metavar="{1,2}",
                   help="generation algorithm (default: the newest, 2: one backbone per seed whatever the head class; "
                        "1: keys from full HF names, reproduces version-1 weights)")
    p.add_argument("--server", default=None, metavar="TARGET",
                   help="server address (host:port, dns:///name:port) or several, comma-separated; default: embedded")
    p.add_argument("--device", default="auto", choices=DEVICES, help="embedded engine (default auto: CUDA, else the CPU kernel)")
    _add_connection_args(p)


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection (with --server)")
    g.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    g.add_argument("--tls-ca", default=None, metavar="PEM", help="CA that signed the server's certificate (implies --tls)")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="this client's certificate, for mutual TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="this client's private key, for mutual TLS")
    g.add_argument("--token", default=os.environ.get("MODELINIT_TOKEN"), metavar="TOKEN",
                   help="bearer token (default: $MODELINIT_TOKEN); @PATH reads it from a file")
    g.add_argument("--retry-deadline", type=float, default=120.0, metavar="S",
                   help="seconds to keep retrying a lost server, resuming the stream where it stopped (default 120; 0: no retries)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelinit", description="Freshly initialized model weights from (spec, policy, seed).")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--host", default="[::]", help="interface to bind (default [::], all)")
    serve.add_argument("--port", type=int, default=50051, help="port (default 50051; 0 picks a free one)")
    serve.add_argument("--device", default="auto", choices=DEVICES,
                       help="engine: auto (CUDA if present, else cpu), cpu (numba), cuda (Triton), reference (numpy, slow)")
    serve.add_argument("--workers", type=int, default=0, help="threads for the reference engine (default: CPU count)")
    serve.add_argument("--grace", type=float, default=30.0, help="seconds to drain streams on SIGTERM (default 30)")
    serve.add_argument("--shutdown-delay", type=float, default=0.0, metavar="S",
                       help="on SIGTERM, seconds to keep serving while health says NOT_SERVING (default 0)")
    lim = serve.add_argument_group("limits")
    lim.add_argument("--max-streams", type=int, default=16, help="concurrent Init streams; more get RESOURCE_EXHAUSTED (default 16)")
    lim.add_argument("--idle-timeout", type=float, default=60.0, metavar="S",
                     help="end a stream whose client reads nothing for S seconds (default 60)")
    lim.add_argument("--max-params", type=int, default=0, help="largest model in parameters (default 0: no cap)")
    lim.add_argument("--max-dim", type=int, default=0, help="largest tensor dimension (default 0: no cap)")
    lim.add_argument("--max-rank", type=int, default=8, help="most dimensions of a tensor (default 8)")
    lim.add_argument("--max-tensors", type=int, default=0, help="most tensors in a model (default 0: no cap)")
    lim.add_argument("--max-request-bytes", type=int, default=4 << 20, help="largest request message (default 4 MiB)")
    sec = serve.add_argument_group("security")
    sec.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)")
    sec.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    sec.add_argument("--tls-client-ca", default=None, metavar="PEM", help="require client certificates signed by this CA (mutual TLS)")
    sec.add_argument("--token", default=os.environ.get("MODELINIT_TOKEN"), metavar="TOKEN",
                     help="require 'authorization: Bearer TOKEN' on every call but health checks (default: $MODELINIT_TOKEN); @PATH reads a file")
    obs = serve.add_argument_group("observability")
    obs.add_argument("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics on this port (0: any free one)")
    obs.add_argument("--metrics-host", default="0.0.0.0", help="interface of the metrics endpoint (default 0.0.0.0)")
    obs.add_argument("--log-format", default="text", choices=("text", "json"), help="text (default) or one JSON object per line")
    obs.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    obs.add_argument("--reflection", action="store_true", help="serve gRPC server reflection (grpcurl)")

    init = sub.add_parser("init", help="write a model's initialized weights into a folder")
    _add_request_args(init)
    init.add_argument("--out", required=True, metavar="DIR", help="output folder")
    init.add_argument("--quiet", action="store_true", help="no progress bar")
    init.add_argument("--fsync", action="store_true", help="flush every file to stable storage before renaming it (power-loss safe, slower)")
    init.add_argument("--parallel", type=int, default=1, metavar="N",
                      help="with --server: fetch N files at once, spread over the replicas (--server h1:p,h2:p or a dns:/// name)")
    init.add_argument("--buffered-io", action="store_true",
                      help="write through the page cache instead of O_DIRECT (same bytes; O_DIRECT is used only where the filesystem allows it)")

    plan = sub.add_parser("plan", help="show every tensor's rule, std and shard without generating anything")
    _add_request_args(plan)
    plan.add_argument("--json", action="store_true", help="print the manifest as JSON")
    plan.add_argument("--tensors", action=argparse.BooleanOptionalAction, default=True,
                      help="list every tensor (the default; fetched page by page, any model size); "
                           "--no-tensors: only the totals and files")

    explain = sub.add_parser("explain", help="tensor groups with their std against the Xavier/LeCun references, and warnings")
    _add_request_args(explain)
    explain.add_argument("--json", action="store_true", help='print {"groups": [...], "summary": {...}} as JSON')

    verify = sub.add_parser("verify", help="check a finished folder against its modelinit.json (sizes, SHA-256, headers), "
                                           "regenerating its bytes from (spec, policy, seed)")
    verify.add_argument("dir", metavar="DIR", help="output folder of `modelinit init`")
    verify.add_argument("--server", default=None, metavar="TARGET", help="server that regenerates the bytes; default: embedded")
    verify.add_argument("--device", default="auto", choices=DEVICES, help="embedded engine (default auto)")
    verify.add_argument("--no-regenerate", dest="regenerate", action="store_false",
                        help="only check the files against the manifest; do not regenerate the bytes")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_connection_args(verify)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"modelinit: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "verify":
        from .verify import run_cli

        return run_cli(args)
    import grpc

    from .client import Client
    from .errors import ModelInitError

    try:
        with connect(args) as client:
            kwargs = dict(seed=args.seed, policy=args.policy, dtype=args.dtype, max_shard_size=args.max_shard_size,
                          algorithm_version=args.algorithm_version, architecture=args.architecture)
            if args.command == "init":
                result = client.init_model(args.spec, out_dir=args.out, progress=not args.quiet and sys.stderr.isatty(),
                                           fsync=args.fsync, direct_io=not args.buffered_io, parallel=args.parallel, **kwargs)
                shards = sum(f.name.endswith(".safetensors") for f in result.files)
                verb = "already complete (verified, nothing written):" if result.reused else "wrote"
                print(f"{verb} {result.total_params:,} parameters ({result.total_bytes / 1e9:.2f} GB) in {shards} shard(s) "
                      f"to {result.path}; fingerprint {result.fingerprint[:16]}")
            elif args.command == "explain":
                _print_explain(client.plan(args.spec, **kwargs), args.json)
            else:
                _print_plan(client.plan(args.spec, tensors=args.tensors, **kwargs), args.json, args.tensors)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0


def connect(args: argparse.Namespace):
    """The Client the command line asks for: embedded, or a server with its TLS, token and retry
    options. ModelInitError for a bad option."""
    import grpc

    from .client import Client, RetryPolicy
    from .credentials import load_token
    from .errors import ModelInitError

    if args.server is None:
        return Client(device=args.device)
    try:
        retry = RetryPolicy(deadline=args.retry_deadline)
        token = load_token(args.token or None)
    except ValueError as e:
        message = str(e)
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, message if message.startswith("token") else f"retry_{message}") from None
    return Client(args.server, tls=args.tls, ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, token=token, retry=retry)


def server_config(args: argparse.Namespace):
    """The ServerConfig of ``modelinit serve ARGS`` (ValueError naming the bad flag)."""
    from modelinit_server.limits import Limits
    from modelinit_server.server import ServerConfig
    from modelinit_server.servicer import StreamPolicy

    return ServerConfig(
        host=args.host, port=args.port, device=args.device, workers=args.workers, grace=args.grace,
        shutdown_delay=args.shutdown_delay,
        limits=Limits(max_params=args.max_params, max_dim=args.max_dim, max_rank=args.max_rank,
                      max_tensors=args.max_tensors, max_request_bytes=args.max_request_bytes),
        streams=StreamPolicy(max_streams=args.max_streams, idle_timeout=args.idle_timeout),
        tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca, token=args.token or None,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, reflection=args.reflection,
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        from modelinit_server.observability import configure_logging
        from modelinit_server.server import serve
    except ImportError as e:
        return _fail(f"serving needs the server extra ({e}); pip install 'modelinit[server]'", 1)
    try:
        config = server_config(args)
        configure_logging(args.log_format, args.log_level)
    except ValueError as e:
        return _fail(str(e), 2)
    try:
        serve(config, ready=lambda line: print(line, flush=True))
    except ValueError as e:  # e.g. the device's engine is not available
        return _fail(str(e), 2)
    except OSError as e:
        return _fail(str(e), 1)
    return 0


def _print_plan(plan, as_json: bool, tensors: bool = True) -> None:
    if as_json:
        from google.protobuf import json_format

        print(json.dumps(json_format.MessageToDict(plan, preserving_proto_field_name=True), indent=2))
        return
    print(f"{plan.architecture} ({plan.family}): {plan.total_params:,} parameters, {plan.total_bytes:,} bytes, "
          f"{sum(f.shard for f in plan.files)} shard(s); algorithm v{plan.algorithm_version}; fingerprint {plan.fingerprint}")
    if not tensors:
        rows = [(f.name, f"{f.size:,}", str(f.tensors) if f.shard else "-") for f in plan.files]
        _print_table(("file", "bytes", "tensors"), rows)
        print(f"\n{plan.tensor_count:,} tensors in {len(plan.groups)} groups (--tensors lists them, `modelinit explain` shows the groups)")
        return
    rows = [(t.name, "x".join(map(str, t.shape)), t.init, f"{t.effective_std:.4g}", t.rule, plan.files[t.shard].name) for t in plan.tensors]
    _print_table(("tensor", "shape", "init", "eff. std", "rule", "file"), rows)


def _print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Columns left-aligned to their widest cell."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def explain_summary(plan) -> dict:
    """Totals over a PlanResponse's groups (what `explain` prints last)."""
    return {
        "total_params": plan.total_params,
        "groups": len(plan.groups),
        "warnings": sum(len(g.warnings) for g in plan.groups),
    }


def _group_label(g) -> str:
    return f"{g.rule} [{g.count} x {'x'.join(map(str, g.shape))}]"


def _ref(x: float, fmt: str) -> str:
    return format(x, fmt) if x else "-"  # 0 means "not applicable" (norms, biases, constants)


def _print_explain(plan, as_json: bool) -> None:
    if as_json:
        from google.protobuf import json_format

        # Fields at their default (0, empty) are printed too, so every group has the same keys, and
        # in proto field order (MessageToDict would put the defaulted ones last).
        def as_dict(g) -> dict:
            d = json_format.MessageToDict(g, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            return {f.name: d[f.name] for f in g.DESCRIPTOR.fields}

        groups = [as_dict(g) for g in plan.groups]
        print(json.dumps({"groups": groups, "summary": explain_summary(plan)}, indent=2))
        return
    print(f"{plan.architecture} ({plan.family}), policy {plan.request.policy.preset or 'custom rules'}:")
    rows = [(g.rule, f"{g.count} x {'x'.join(map(str, g.shape))}", g.init, f"{g.effective_std:.4g}",
             _ref(g.xavier_std, ".4g"), _ref(g.lecun_std, ".4g"), _ref(g.ratio_lecun, ".3g")) for g in plan.groups]
    _print_table(("rule", "tensors", "init", "eff. std", "xavier", "lecun", "ratio"), rows)
    warnings = [f"{_group_label(g)}: {w}" for g in plan.groups for w in g.warnings]
    if warnings:
        print("\nwarnings:")
        for w in warnings:
            print(f"  {w}")
    s = explain_summary(plan)
    print(f"\n{s['total_params']:,} parameters in {s['groups']} groups; {s['warnings']} warning(s)")


if __name__ == "__main__":
    sys.exit(main())
