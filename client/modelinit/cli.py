"""The `modelinit` command line: serve, init, plan, explain.

Without --server, init, plan and explain run embedded: an in-process server on the same code path.
Errors print one line (`modelinit: error: ...`) and exit non-zero (2 for bad input).
"""
from __future__ import annotations

import argparse
import json
import sys

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda", "reference")


def _add_request_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="preset name (e.g. bert-base-uncased) or path to an HF config.json")
    p.add_argument("--seed", type=int, default=0, help="seed, 0 <= seed < 2^64 (default 0)")
    p.add_argument("--policy", default=None, metavar="P",
                   help="init policy: a preset (hf-default, the default; bert-tf, gpt2, megatron, torchtitan-llama3, xavier, "
                        "kaiming, small-init, torch-trunc-normal) or a JSON/YAML policy file")
    p.add_argument("--dtype", default="float32", help=f"output dtype: {', '.join(DTYPES)} (default float32)")
    p.add_argument("--max-shard-size", default="5GB", help="largest shard, e.g. 5GB (10^9 bytes), 500MB, 2GiB (default 5GB)")
    p.add_argument("--server", default=None, metavar="TARGET", help="server address (host:port, dns:///name:port); default: embedded")
    p.add_argument("--device", default="auto", choices=DEVICES, help="embedded engine (default auto: CUDA, else the CPU kernel)")


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

    init = sub.add_parser("init", help="write a model's initialized weights into a folder")
    _add_request_args(init)
    init.add_argument("--out", required=True, metavar="DIR", help="output folder")
    init.add_argument("--quiet", action="store_true", help="no progress bar")
    init.add_argument("--fsync", action="store_true", help="flush every file to stable storage before renaming it (power-loss safe, slower)")
    init.add_argument("--buffered-io", action="store_true",
                      help="write through the page cache instead of O_DIRECT (same bytes; O_DIRECT is used only where the filesystem allows it)")

    plan = sub.add_parser("plan", help="show every tensor's rule, std and shard without generating anything")
    _add_request_args(plan)
    plan.add_argument("--json", action="store_true", help="print the manifest as JSON")

    explain = sub.add_parser("explain", help="tensor groups with their std against the Xavier/LeCun references, and warnings")
    _add_request_args(explain)
    explain.add_argument("--json", action="store_true", help='print {"groups": [...], "summary": {...}} as JSON')
    return parser


def _fail(message: str, code: int) -> int:
    print(f"modelinit: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    import grpc

    from .client import Client
    from .errors import ModelInitError

    try:
        with Client(args.server, device=args.device) as client:
            kwargs = dict(seed=args.seed, policy=args.policy, dtype=args.dtype, max_shard_size=args.max_shard_size)
            if args.command == "init":
                result = client.init_model(args.spec, out_dir=args.out, progress=not args.quiet and sys.stderr.isatty(),
                                           fsync=args.fsync, direct_io=not args.buffered_io, **kwargs)
                shards = sum(f.name.endswith(".safetensors") for f in result.files)
                print(f"wrote {result.total_params:,} parameters ({result.total_bytes / 1e9:.2f} GB) in {shards} shard(s) "
                      f"to {result.path}; fingerprint {result.fingerprint[:16]}")
            elif args.command == "explain":
                _print_explain(client.plan(args.spec, **kwargs), args.json)
            else:
                _print_plan(client.plan(args.spec, **kwargs), args.json)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0


def _serve(args: argparse.Namespace) -> int:
    try:
        from modelinit_server.server import ServerConfig, serve
    except ImportError as e:
        return _fail(f"serving needs the server extra ({e}); pip install 'modelinit[server]'", 1)
    try:
        config = ServerConfig(host=args.host, port=args.port, device=args.device, workers=args.workers, grace=args.grace)
    except ValueError as e:
        return _fail(str(e), 2)
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(config, ready=lambda line: print(line, flush=True))
    except ValueError as e:  # e.g. the device's engine is not available
        return _fail(str(e), 2)
    except OSError as e:
        return _fail(str(e), 1)
    return 0


def _print_plan(plan, as_json: bool) -> None:
    if as_json:
        from google.protobuf import json_format

        print(json.dumps(json_format.MessageToDict(plan, preserving_proto_field_name=True), indent=2))
        return
    print(f"{plan.architecture} ({plan.family}): {plan.total_params:,} parameters, {plan.total_bytes:,} bytes, "
          f"{sum(f.shard for f in plan.files)} shard(s); algorithm v{plan.algorithm_version}; fingerprint {plan.fingerprint}")
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
