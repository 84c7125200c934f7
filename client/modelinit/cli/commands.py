"""One handler per command: each takes the parsed arguments and returns the exit status (0, 2 for
bad input, 1 for the environment, 130 for Ctrl-C), its errors one line on stderr."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import grpc
from modelinit_wire import releases
from modelinit_wire.credentials import load_token

from .. import server_extra
from ..client import Client
from ..errors import ModelInitError
from ..job import check_parts, parse_bytes, parse_rate, print_parts, run_job
from ..manifest import read_manifest
from ..request import RequestOptions
from ..sources.remote import RetryPolicy
from ..verify import embedded_client, verify_folder
from .common import _fail
from .output import print_explain, print_plan

#: The flag of each request option (:class:`~modelinit.request.RequestOptions`; with --from-manifest the
#: manifest's own are used).
REQUEST_FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(RequestOptions)}


def init(args: argparse.Namespace) -> int:
    """``modelinit init``: SPEC (or --from-manifest) into --out, embedded, served, one part or on Ray."""
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return _fail(f"--out: {args.out} is a file, not a folder; give the folder to write into", 2)
    if args.parallel is not None and args.parallel < 1:
        return _fail(f"--parallel: must be at least 1, got {args.parallel}", 2)
    if problem := _from_manifest_problem(args):
        return _fail(problem, 2)
    if args.ray is not None and args.ray < 1:
        return _fail(f"--ray: must be at least 1 task, got {args.ray}", 2)
    if args.ray is not None and (args.part or args.from_manifest):
        return _fail("--ray: N >= 1 tasks write the parts themselves; not with --part or --from-manifest", 2)
    return _with_client(args, _write)


def _write(client: Client, args: argparse.Namespace, kwargs: dict) -> int:
    write = dict(out_dir=args.out, progress=not args.quiet and sys.stderr.isatty(), fsync=args.fsync,
                 direct_io=not args.buffered_io, parallel=args.parallel, overwrite=args.overwrite, part=args.part)
    if args.from_manifest is not None:
        result = client.init_model_from_manifest(args.from_manifest, **write)
    elif args.ray is not None:
        from .. import ray as on_ray  # Ray loads only here

        result = on_ray.init_model(args.spec, parts=args.ray, out_dir=args.out, server=args.server,
                                   overwrite=args.overwrite, fsync=args.fsync, direct_io=not args.buffered_io,
                                   **kwargs)
    else:
        result = client.init_model(args.spec, **write, **kwargs)
    shards = sum(f.name.endswith(".safetensors") for f in result.files)
    if not result.complete:
        # only a --part run whose own shards are in ends here (anything else raises in the client)
        missing = ", ".join(map(str, result.missing_parts[:16])) + (" ..." if len(result.missing_parts) > 16 else "")
        size = sum(f.size for f in result.files)
        print(f"wrote part {args.part}: {shards} shard(s) ({size / 1e9:.2f} GB) to {result.path}; part(s) {missing} "
              f"not finished yet, so no modelinit.json yet: the last part (or `modelinit finalize {result.path}`) "
              f"writes it; fingerprint {result.fingerprint[:16]}")
        return 0
    verb = "already complete (verified, nothing written):" if result.reused else "wrote"
    print(f"{verb} {result.total_params:,} parameters ({result.total_bytes / 1e9:.2f} GB) in {shards} shard(s) "
          f"to {result.path}; fingerprint {result.fingerprint[:16]}")
    return 0


def plan(args: argparse.Namespace) -> int:
    """``modelinit plan``: every tensor's rule, std and shard (--parts N: how init --part splits the shards)."""
    if args.parts is not None and args.json:
        return _fail("--parts: prints a table; not with --json", 2)

    def show(client: Client, args: argparse.Namespace, kwargs: dict) -> int:
        if args.parts is not None:  # how `init --part K/N` splits the shards
            check_parts(args.parts)  # a bad --parts or --rate fails before planning
            rate = parse_rate(args.rate)
            print_parts(client.plan(args.spec, tensors=False, **kwargs), args.parts, rate)
        else:
            print_plan(client.plan(args.spec, tensors=args.tensors, **kwargs), args.json, args.tensors)
        return 0

    return _with_client(args, show)


def explain(args: argparse.Namespace) -> int:
    """``modelinit explain``: the tensor groups against the Xavier/LeCun references, and warnings."""
    def show(client: Client, args: argparse.Namespace, kwargs: dict) -> int:
        print_explain(client.plan(args.spec, **kwargs), args.json, args.policy)
        return 0

    return _with_client(args, show)


def _with_client(args: argparse.Namespace, body) -> int:
    """``body(client, args, request keywords)`` with the client the flags ask for; a ModelInitError as
    one line (2 for bad input, else 1)."""
    try:
        with connect(args) as client:
            kwargs = RequestOptions(seed=args.seed or 0, policy=args.policy, dtype=args.dtype, max_shard_size=args.max_shard_size,
                                    algorithm_version=args.algorithm_version, architecture=args.architecture).keywords()
            return body(client, args, kwargs)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def job(args: argparse.Namespace) -> int:
    """``modelinit job``: the Kubernetes Indexed Job's manifest on stdout."""
    try:
        return run_job(args)
    except ModelInitError as e:
        return _fail(e.details, 2)

def probe(args: argparse.Namespace) -> int:
    """``modelinit probe``: one measured pass of the filled model (with --widths, the coordinate check)."""
    from ..probing import probe as probe_pass
    from ..server_extra import probe_report

    policies: list[str | None] = [args.policy or "hf-default"]
    for p in (args.compare or "").split(","):
        if p.strip() and p.strip() not in policies:
            policies.append(p.strip())
    try:
        budget = int(parse_bytes(args.memory_budget, "--memory-budget")) if args.memory_budget is not None else None
    except ModelInitError as e:
        return _fail(e.details, 2)
    if args.widths is not None:
        return _coord_check(args, policies, budget)
    alone = [flag for flag, v in (("--steps", args.steps), ("--lr", args.lr), ("--optimizer", args.optimizer)) if v is not None]
    if alone:
        return _fail(f"{alone[0]}: only with --widths (the coordinate check); the probe itself is one pass without steps", 2)
    try:
        report, to_json = probe_report(table=args.json != "-", plot=bool(args.plot))
        results = probe_pass(args.spec, policies=policies, seed=args.seed, architecture=args.architecture,
                        batch=args.batch, seq=args.seq, memory_budget=budget, proxy=args.proxy)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    return _probe_output(args, results, report.plot, to_json, report.render)


def _coord_check(args: argparse.Namespace, policies: list[str | None], budget: int | None) -> int:
    """``modelinit probe SPEC --widths ...``: the coordinate check (docs/probe.md)."""
    from ..probing import coord_check
    from ..server_extra import coord_report

    try:
        widths = [int(w) for w in args.widths.split(",") if w.strip()]
    except ValueError:
        return _fail(f"--widths: give hidden sizes separated by commas, e.g. 128,256,512,1024; got {args.widths!r}", 2)
    if args.proxy is not None:
        return _fail("--proxy: the coordinate check sets the widths itself; leave --proxy / --no-proxy out with --widths", 2)
    try:
        report, to_json = coord_report(table=args.json != "-", plot=bool(args.plot))
        results = coord_check(args.spec, policies=policies, widths=widths, steps=3 if args.steps is None else args.steps,
                              optimizer=args.optimizer or "adam",
                              lr=args.lr, seed=args.seed, architecture=args.architecture, batch=args.batch, seq=args.seq,
                              memory_budget=budget)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    return _probe_output(args, results, report.plot_coord, to_json, report.render_coord)


def _probe_output(args: argparse.Namespace, results: list, plot, to_json, render) -> int:
    """The probe's or coordinate check's ``--plot`` file, ``--json`` (a file, or ``-`` for stdout
    instead of the table) and table; 1 with one line if a file cannot be written."""
    if args.plot:
        try:
            plot(results, args.plot)
        except OSError as e:
            return _fail(f"--plot: cannot write {args.plot}: {e.strerror or e}", 1)
    if args.json == "-":
        print(to_json(results))
        return 0
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(to_json(results))
        except OSError as e:
            return _fail(f"--json: cannot write {args.json}: {e.strerror or e}", 1)
    render(results)
    return 0


def _from_manifest_problem(args: argparse.Namespace) -> str | None:
    """Why ``init``'s SPEC / --from-manifest / request options do not go together, or None."""
    if args.from_manifest is None:
        return None if args.spec is not None else "init: give SPEC (a preset or config.json) or --from-manifest PATH"
    if args.spec is not None:
        return f"init: give SPEC or --from-manifest, not both (the manifest records the spec; got SPEC {args.spec!r})"
    given = [flag for dest, flag in REQUEST_FLAGS.items() if getattr(args, dest) is not None]
    if given:
        return (f"init: --from-manifest replays the recorded request exactly; {', '.join(given)} cannot change it "
                "(run init with SPEC for another request)")
    return None


def connect(args: argparse.Namespace):
    """The Client the command line asks for: embedded, or a server with its TLS, token and retry
    options. ModelInitError for a bad option."""
    if args.server is None:
        return Client(device=args.device)
    try:
        retry = RetryPolicy(deadline=args.retry_deadline)
        token = load_token(args.token or None)
    except ValueError as e:
        message = str(e)
        raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, message if message.startswith("token") else f"retry_{message}") from None
    return Client(args.server, tls=args.tls, ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, token=token, retry=retry,
                  rehash=getattr(args, "rehash", False))


def serve(args: argparse.Namespace) -> int:
    """``modelinit serve``: the gRPC server (the server extra)."""
    return server_extra.serve(args, _fail)


def finalize(args: argparse.Namespace) -> int:
    """``modelinit finalize URL``: 0 complete, 3 parts still missing (nothing written; rerun it
    later), 2 bad input, 1 the environment."""
    try:
        with connect(args) as client:  # embedded without --server
            result = client.finalize(args.url)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION) else 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    if not result.complete:
        missing = ", ".join(map(str, result.missing_parts[:16])) + (" ..." if len(result.missing_parts) > 16 else "")
        return _fail(f"{result.path}: part(s) {missing} not finished yet; nothing written (run finalize again after them)",
                     EXIT_PARTS_MISSING)
    print(f"{'already complete (its last part finished it; nothing written)' if result.reused else 'complete'}: "
          f"{result.total_params:,} parameters ({result.total_bytes / 1e9:.2f} GB) in "
          f"{sum(f.name.endswith('.safetensors') for f in result.files)} shard(s) at {result.path}; "
          f"fingerprint {result.fingerprint[:16]}")
    return 0


#: ``modelinit finalize``'s exit status while a part is missing: retry later (not an error of the input).
EXIT_PARTS_MISSING = 3


def verify(args: argparse.Namespace) -> int:
    """``modelinit verify DIR``: 0 ok, 1 problems found (or the server failed), 2 bad input."""
    def fail(message: str, code: int) -> int:
        print(f"modelinit: error: {message}", file=sys.stderr)
        return code

    try:
        read_manifest(args.dir, "path")  # bad input (no folder, no manifest) before starting anything
        client = None
        if args.regenerate:
            client = connect(args) if args.server else embedded_client(args.device)
        try:
            report = verify_folder(args.dir, client=client, regenerate=args.regenerate,
                                   progress=not args.json and sys.stderr.isatty())
        finally:
            if client is not None:
                client.close()
    except ModelInitError as e:
        bad_input = e.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
        return fail(e.details, 2 if bad_input else 1)
    except KeyboardInterrupt:
        return fail("interrupted", 130)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0 if report.ok else 1
    for f in report.files:
        if f.problem is None:
            print(f"ok   {f.name}  {f.size}  {(f.sha256 or '')[:16]}")
        else:
            print(f"BAD  {f.name}: {f.problem}")
    bad_files = {f.name for f in report.files if f.problem}
    for p in report.problems:
        if p.split(": ", 1)[0] not in bad_files:
            print(f"BAD  {p}")
    for note in report.notes:
        print(f"note: {note}")
    how = "sizes, SHA-256, headers and index checked" + ("; bytes regenerated and identical" if report.regenerated else "")
    if report.ok:
        print(f"ok: {len(report.files)} files verified ({how}); fingerprint {report.fingerprint[:16]}")
        return 0
    print(f"BAD: {len(report.problems)} problem(s) in {report.path} ({len(bad_files)} of {len(report.files)} files bad)")
    return 1


#: What ``modelinit versions`` reports: the distributions that decide the bytes (the kernels' compilers
#: and numerics, transformers' architectures) or the stacks init_module_ maps, then the transport.
VERSIONED = ("modelinit", "numpy", "numba", "llvmlite", "triton", "torch", "transformers", "safetensors",
             "megatron-core", "torchtitan", "grpcio", "protobuf", "crc32c", "obstore", "ray")


def versions(args: argparse.Namespace) -> int:
    """``modelinit versions``: each distribution's installed version (``-``: not installed; one below
    modelinit's floor marked, and listed under ``below_floor`` in ``--json``), the Python and the
    platform, for a bug report; read from the installed metadata, nothing imported."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    low: dict[str, str] = {}
    for name in VERSIONED:
        below = releases.below_floor(name)
        if below is not None:
            low[name] = below[1]
    report = {"python": platform.python_version(), "platform": platform.platform(), "machine": platform.machine(),
              "packages": found, "below_floor": low}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"python {report['python']} on {report['platform']} ({report['machine']})")
    for name, v in found.items():
        print(f"{name:14s} {v or '-'}" + (f"  (below modelinit's floor {low[name]}: refused)" if name in low else ""))
    return 0
