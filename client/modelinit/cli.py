"""The `modelinit` command line: serve, init, finalize, plan, explain, job, probe, verify.

    serve      run the gRPC server (needs the server extra)
    init       write a model's initialized weights into a folder or an object-store prefix
               (--part K/N: one part of N; --ray N: N parts as Ray tasks)
    finalize   after `init --part K/N` of every part: the index, config.json and modelinit.json
    plan       every tensor's rule, std and shard, nothing generated (--parts N: the split)
    explain    tensor groups with their std against the Xavier/LeCun references, and warnings
    job        print the Kueue-admitted Kubernetes Indexed Job whose N pods write one checkpoint
    probe      one measured forward and backward pass of the model filled with a policy's bytes;
               with --widths, the coordinate check over widths and steps (needs the server and probe extras)
    verify     check a finished folder or prefix against its modelinit.json (and, unless told
               not to, regenerate its bytes)

Without --server, init, finalize, plan, explain and verify run embedded: an in-process server on
the same code path.
Errors print one line (`modelinit: error: ...`) and exit non-zero (2 for bad input).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import json
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from typing import NoReturn

import grpc
from modelinit_wire.constants import (
    ALGORITHM_VERSION,
    ALGORITHM_VERSIONS,
    DEFAULT_MAX_DIM,
    DEFAULT_MAX_PARAMS,
    DEFAULT_MAX_RANK,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TENSORS,
    DEVICES,
    DTYPES,
    MUP_BASE_WIDTH,
)
from modelinit_wire.credentials import load_token
from modelinit_wire.policy_file import looks_like_file, to_dict

from . import server_extra
from .client import Client
from .errors import ModelInitError, ModelInitWarning
from .job import add_job_parser, check_parts, parse_bytes, parse_rate, print_parts, run_job
from .manifest import read_manifest
from .request import RequestOptions
from .sources.remote import RetryPolicy
from .verify import embedded_client, verify_folder

#: The flag of each request option (:class:`~modelinit.request.RequestOptions`; with --from-manifest the
#: manifest's own are used).
REQUEST_FLAGS = {f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(RequestOptions)}


def _add_request_args(p: argparse.ArgumentParser, from_manifest: bool = False, shards: bool = True,
                      generates: bool = True) -> None:
    """The request's flags. ``shards``: the command shows or writes shards (--max-shard-size);
    ``generates``: it generates bytes (--device, --rehash). A flag that changes nothing a command
    does is not offered (``explain --help`` lists no shard size); its value is the default."""
    if from_manifest:
        p.add_argument("spec", metavar="SPEC", nargs="?", default=None,
                       help="preset name (e.g. bert-base-uncased) or path to an HF config.json; not with --from-manifest")
        p.add_argument("--from-manifest", default=None, metavar="PATH",
                       help="reproduce a run byte for byte: the request recorded in PATH (an output folder or its "
                            "modelinit.json): spec, architecture, policy, seed, dtype, shard size, algorithm version")
    else:
        p.add_argument("spec", metavar="SPEC", help="preset name (e.g. bert-base-uncased) or path to an HF config.json")
    # Request options default to None (the server's defaults, given in the help) so that an explicit
    # one can be told apart, and refused beside --from-manifest.
    p.add_argument("--seed", type=int, default=None, help="seed, 0 <= seed < 2^64 (default 0)")
    p.add_argument("--policy", default=None, metavar="P",
                   help="init policy: a preset (hf-default, the default; bert-tf, gpt2, megatron, torchtitan-llama3, xavier, "
                        "kaiming, lecun-normal, small-init, torch-trunc-normal, olmo2, gpt-neox, deepnet, mup) or a JSON/YAML policy file")
    p.add_argument("--dtype", default=None, help=f"output dtype: {', '.join(DTYPES)} (default float32)")
    if shards:
        p.add_argument("--max-shard-size", default=None, help="largest shard, e.g. 5GB (10^9 bytes), 500MB, 2GiB (default 5GB)")
    else:
        p.set_defaults(max_shard_size=None)
    p.add_argument("--architecture", default=None, metavar="CLASS",
                   help="model class overriding the spec's architectures[0], e.g. BertModel, LlamaForCausalLM")
    p.add_argument("--algorithm-version", type=int, default=None, choices=ALGORITHM_VERSIONS, metavar="{1,2}",
                   help="generation algorithm (default: the newest, 2: one backbone per seed whatever the head class; "
                        "1: keys from full HF names, reproduces version-1 weights)")
    p.add_argument("--server", default=None, metavar="TARGET",
                   help="server address (host:port, dns:///name:port) or several, comma-separated; default: embedded")
    if generates:
        p.add_argument("--device", default="auto", choices=DEVICES, help="embedded engine (default auto: CUDA, else the CPU kernel)")
    else:
        p.set_defaults(device="auto")
    _add_connection_args(p, generates)


def _add_connection_args(p: argparse.ArgumentParser, generates: bool = True) -> None:
    g = p.add_argument_group("connection (with --server)")
    g.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    g.add_argument("--tls-ca", default=None, metavar="PEM", help="CA that signed the server's certificate (implies --tls)")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="this client's certificate, for mutual TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="this client's private key, for mutual TLS")
    g.add_argument("--token", default=os.environ.get("MODELINIT_TOKEN"), metavar="TOKEN",
                   help="bearer token (default: $MODELINIT_TOKEN); @PATH reads it from a file")
    g.add_argument("--retry-deadline", type=float, default=120.0, metavar="S",
                   help="seconds to keep retrying a lost server, resuming the stream where it stopped (default 120; 0: no retries); "
                        "a server never reached or a TLS failure is not retried")
    if not generates:
        return
    g.add_argument("--rehash", action="store_true",
                   help="also SHA-256 every received byte here (a second pass over the data; each message's CRC32C is "
                        "checked either way, and the manifest records the server's digest of the generated bytes)")


def version_line() -> str:
    """What ``modelinit --version`` prints: the installed package's version and the generation
    algorithm versions it produces (the newest is the default; docs/determinism.md)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("modelinit")
    except PackageNotFoundError:  # a source tree that was never installed
        from . import __version__ as installed
    return f"modelinit {installed} (algorithm versions {', '.join(map(str, ALGORITHM_VERSIONS))}; default {ALGORITHM_VERSION})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit 0 (computed only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelinit", description="Freshly initialized model weights from (spec, policy, seed).")
    parser.add_argument("--version", action=_VersionAction, help="print the version and the algorithm versions, and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--host", default="[::]", help="interface to bind (default [::], all)")
    serve.add_argument("--port", type=int, default=50051, help="port (default 50051; 0 picks a free one)")
    serve.add_argument("--device", default="auto", choices=DEVICES,
                       help="engine: auto (CUDA if present, else cpu), cpu (numba), cuda (Triton), reference (numpy, slow)")
    serve.add_argument("--workers", type=int, default=0, help="threads for the reference engine (default: the usable cores)")
    serve.add_argument("--grace", type=float, default=30.0, help="seconds to drain streams on SIGTERM (default 30)")
    serve.add_argument("--shutdown-delay", type=float, default=0.0, metavar="S",
                       help="on SIGTERM, seconds to keep serving while health says NOT_SERVING (default 0)")
    lim = serve.add_argument_group("limits")
    lim.add_argument("--max-streams", type=int, default=16, help="concurrent Init streams; more get RESOURCE_EXHAUSTED (default 16)")
    lim.add_argument("--idle-timeout", type=float, default=60.0, metavar="S",
                     help="end a stream whose client reads nothing for S seconds (default 60)")
    lim.add_argument("--max-params", type=int, default=DEFAULT_MAX_PARAMS,
                     help=f"largest model in parameters (default {DEFAULT_MAX_PARAMS}; 0: no cap)")
    lim.add_argument("--max-dim", type=int, default=DEFAULT_MAX_DIM,
                     help=f"largest tensor dimension (default {DEFAULT_MAX_DIM}; 0: no cap)")
    lim.add_argument("--max-rank", type=int, default=DEFAULT_MAX_RANK, help=f"most dimensions of a tensor (default {DEFAULT_MAX_RANK}; 0: no cap)")
    lim.add_argument("--max-tensors", type=int, default=DEFAULT_MAX_TENSORS,
                     help=f"most tensors in a model (default {DEFAULT_MAX_TENSORS}; 0: no cap)")
    lim.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                     help=f"largest request message (default {DEFAULT_MAX_REQUEST_BYTES >> 20} MiB)")
    sec = serve.add_argument_group("security")
    sec.add_argument("--tls-cert", default=None, metavar="PEM", help="serve TLS with this certificate chain (needs --tls-key)")
    sec.add_argument("--tls-key", default=None, metavar="PEM", help="private key of --tls-cert")
    sec.add_argument("--tls-client-ca", default=None, metavar="PEM", help="require client certificates signed by this CA (mutual TLS)")
    sec.add_argument("--token", default=os.environ.get("MODELINIT_TOKEN"), metavar="TOKEN",
                     help="require 'authorization: Bearer TOKEN' on every call but health checks (default: $MODELINIT_TOKEN); @PATH reads a file")
    obs = serve.add_argument_group("observability")
    obs.add_argument("--metrics-port", type=int, default=None, metavar="PORT", help="serve Prometheus /metrics on this port (0: any free one)")
    obs.add_argument("--metrics-host", default=None,
                     help="interface of the metrics endpoint (default: the same as --host; 0.0.0.0 or :: for every interface)")
    obs.add_argument("--log-format", default="text", choices=("text", "json"), help="text (default) or one JSON object per line")
    obs.add_argument("--log-level", default="INFO", help="DEBUG, INFO (default), WARNING, ERROR")
    obs.add_argument("--reflection", action="store_true", help="serve gRPC server reflection (grpcurl)")

    init = sub.add_parser("init", help="write a model's initialized weights into a folder")
    _add_request_args(init, from_manifest=True)
    init.add_argument("--out", required=True, metavar="DIR|URL",
                      help="output folder, or an object-store prefix: s3://bucket/prefix (also gs://, az://, file://; "
                           "needs the cloud extra, docs/install.md)")
    init.add_argument("--part", default=None, metavar="K/N",
                      help="write only part K of N (0-based, as JOB_COMPLETION_INDEX): a byte-balanced share of the shards; "
                           "the part that finds all N there writes the index, config.json and modelinit.json")
    init.add_argument("--ray", type=int, default=None, metavar="N",
                      help="write with N Ray tasks, part K/N each, on the Ray cluster of $RAY_ADDRESS or a local one (a task "
                           "whose worker dies is run again); --out must be a bucket or a folder every worker mounts "
                           "(needs the ray extra, docs/install.md)")
    init.add_argument("--quiet", action="store_true", help="no progress bar")
    init.add_argument("--fsync", action="store_true", help="flush every file to stable storage before renaming it (power-loss safe, slower)")
    init.add_argument("--parallel", type=int, default=None, metavar="N",
                      help="N files at once: with --server spread over the replicas (--server h1:p,h2:p or a dns:/// name; "
                           "default: a quarter of this node's usable cores, at least 1); embedded, each with its own producer and SHA-256 (default: chosen for this machine, "
                           "several on GPU nodes and many cores, where one file's hash is the bottleneck; 1 on small machines)")
    init.add_argument("--buffered-io", action="store_true",
                      help="write through the page cache instead of O_DIRECT (same bytes; O_DIRECT is used only where the filesystem allows it)")
    init.add_argument("--overwrite", action="store_true",
                      help="delete files in --out that no modelinit run wrote and a loader would pick up (*.safetensors, *.bin, "
                           "*.index.json, config.json, ...); without it they are refused. An earlier modelinit run's files are "
                           "always replaced")

    fin = sub.add_parser("finalize", help="after `init --part K/N` of every part: write the index, config.json and "
                                          "modelinit.json once (the last part does it itself; this is for a final step)")
    fin.add_argument("url", metavar="URL", help="the --out the parts wrote (s3://bucket/prefix, gs://, az://, or a shared folder)")
    fin.add_argument("--server", default=None, metavar="TARGET", help="server that regenerates the small files; default: embedded")
    fin.add_argument("--device", default="auto", choices=DEVICES, help="embedded engine (default auto)")
    _add_connection_args(fin)

    plan = sub.add_parser("plan", help="show every tensor's rule, std and shard without generating anything")
    _add_request_args(plan, generates=False)
    plan.add_argument("--json", action="store_true", help="print the manifest as JSON")
    plan.add_argument("--tensors", action=argparse.BooleanOptionalAction, default=True,
                      help="list every tensor (the default; fetched page by page, any model size); "
                           "--no-tensors: only the totals and files")
    plan.add_argument("--parts", type=int, default=None, metavar="N",
                      help="how `init --part K/N` (and `modelinit job --parts N`) splits the shards: each part's shards, "
                           "bytes and time at --rate")
    plan.add_argument("--rate", default="0.5GB/s", metavar="R", help="bytes per second one part writes, for --parts (default 0.5GB/s)")

    explain = sub.add_parser("explain", help="tensor groups with their std against the Xavier/LeCun references, and warnings")
    _add_request_args(explain, shards=False, generates=False)
    explain.add_argument("--json", action="store_true", help='print {"groups": [...], "summary": {...}} as JSON')

    add_job_parser(sub)

    probe = sub.add_parser("probe", help="fill the real model with a policy's bytes, run one forward and backward pass on a "
                                         "synthetic batch, and report per layer what the init does (docs/probe.md)")
    probe.add_argument("spec", metavar="SPEC", help="preset name (e.g. bert-base-uncased) or path to an HF config.json")
    probe.add_argument("--policy", default=None, metavar="P", help="policy to probe: a preset or a policy file (default hf-default)")
    probe.add_argument("--compare", default=None, metavar="P1,P2,...",
                       help="more policies (presets or files, comma-separated), probed on the same batch")
    probe.add_argument("--seed", type=int, default=0, help="seed of the weights and of the synthetic batch (default 0)")
    probe.add_argument("--architecture", default=None, metavar="CLASS", help="model class overriding the spec's")
    probe.add_argument("--batch", type=int, default=4, help="sequences (or images) in the batch (default 4)")
    probe.add_argument("--seq", type=int, default=128, help="tokens per sequence (default 128, at most the model's positions)")
    probe.add_argument("--memory-budget", default=None, metavar="SIZE",
                       help="memory the pass may take, e.g. 8GB (default: half the available memory)")
    proxy = probe.add_mutually_exclusive_group()
    proxy.add_argument("--proxy", type=int, default=None, metavar="F",
                       help="probe a depth-preserving proxy with every width / F (default: the whole model when it fits "
                            "the memory budget, else the smallest power of two that fits)")
    proxy.add_argument("--no-proxy", dest="proxy", action="store_const", const=1,
                       help="the whole model or nothing: refuse, with the figures, when it does not fit")
    probe.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                       help="write the results as JSON to FILE (or stdout with no FILE) instead of the table")
    probe.add_argument("--plot", default=None, metavar="FILE.png", help="per-layer curves of each measure, one line per policy "
                                                                         "(with --widths: the coordinate-check plot)")
    probe.add_argument("--widths", default=None, metavar="W1,W2,...",
                       help="coordinate check: rebuild the model at these hidden sizes (head size kept), train --steps "
                            "steps and report each module's scale against width (docs/probe.md)")
    probe.add_argument("--steps", type=int, default=None, help="with --widths: optimizer steps, t = 1 being the init (default 3)")
    probe.add_argument("--lr", type=float, default=None, help="with --widths: learning rate (default 1e-3 for adam, 0.1 for sgd; "
                                                            "the mup preset gets µP's per-parameter rates from it)")
    probe.add_argument("--optimizer", default=None, choices=("adam", "sgd"), help="with --widths: the optimizer (default adam)")

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
    message = " ".join(str(message).split())  # one line, whatever the message holds
    try:
        print(f"modelinit: error: {message}", file=sys.stderr)
    except (OSError, ValueError):  # stderr gone too
        pass
    return code


#: Exit status after the reader of stdout went away (``modelinit plan gpt2 | head -1``): 128 +
#: SIGPIPE, what a shell reports for a command killed by the broken pipe.
EXIT_BROKEN_PIPE = 141


@contextlib.contextmanager
def _notes() -> Iterator[None]:
    """Each :class:`~modelinit.errors.ModelInitWarning` as one ``modelinit: note: ...`` line on
    stderr (a part with no shard to write, ...); other warnings as Python shows them."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ModelInitWarning):
            print(f"modelinit: note: {' '.join(str(message).split())}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", ModelInitWarning)
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status: 0, 2 for bad input (arguments, spec,
    policy, a file given as --out), 1 for the environment (a server, the disk, a busy folder),
    130 for Ctrl-C, 141 when stdout's reader is gone. Errors are one line on stderr
    (``modelinit: error: ...``), never a traceback (``MODELINIT_DEBUG=1`` shows one for an
    unexpected error)."""
    try:
        with _notes():
            code = _main(argv)
        if sys.stdout is not None:
            sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as e:  # the environment: a file that cannot be read or written
        where = f"{e.filename}: " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}", 1)
    except RecursionError:
        return _fail("input nested too deeply", 2)
    except Exception as e:
        if os.environ.get("MODELINIT_DEBUG"):
            raise
        text = " ".join(str(e).split())
        return _fail(f"unexpected {type(e).__name__}: {text[:300]} (a bug: please report it; MODELINIT_DEBUG=1 shows the traceback)", 1)


def _drop_stdout() -> None:
    """Point stdout at /dev/null: the interpreter flushes it once more at exit, which would
    fail on the closed pipe again (and print a traceback of its own)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (in-process, captured)
        pass


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "init" and os.path.exists(args.out) and not os.path.isdir(args.out):
        return _fail(f"--out: {args.out} is a file, not a folder; give the folder to write into", 2)
    if args.command == "init" and args.parallel is not None and args.parallel < 1:
        return _fail(f"--parallel: must be at least 1, got {args.parallel}", 2)
    if args.command == "init" and (problem := _from_manifest_problem(args)):
        return _fail(problem, 2)
    if args.command == "init" and args.ray is not None and args.ray < 1:
        return _fail(f"--ray: must be at least 1 task, got {args.ray}", 2)
    if args.command == "init" and args.ray is not None and (args.part or args.from_manifest):
        return _fail("--ray: N >= 1 tasks write the parts themselves; not with --part or --from-manifest", 2)
    if args.command == "serve":
        return _serve(args)
    if args.command == "verify":
        return _verify(args)
    if args.command == "finalize":
        return _finalize(args)
    if args.command == "job":
        try:
            return run_job(args)
        except ModelInitError as e:
            return _fail(e.details, 2)
    if args.command == "probe":
        return _probe(args)
    if args.command == "plan" and args.parts is not None and args.json:
        return _fail("--parts: prints a table; not with --json", 2)
    try:
        with connect(args) as client:
            kwargs = RequestOptions(seed=args.seed or 0, policy=args.policy, dtype=args.dtype, max_shard_size=args.max_shard_size,
                                    algorithm_version=args.algorithm_version, architecture=args.architecture).keywords()
            if args.command == "init":
                write = dict(out_dir=args.out, progress=not args.quiet and sys.stderr.isatty(), fsync=args.fsync,
                             direct_io=not args.buffered_io, parallel=args.parallel, overwrite=args.overwrite, part=args.part)
                if args.from_manifest is not None:
                    result = client.init_model_from_manifest(args.from_manifest, **write)
                elif args.ray is not None:
                    from . import ray as on_ray  # Ray loads only here

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
            elif args.command == "explain":
                _print_explain(client.plan(args.spec, **kwargs), args.json, args.policy)
            elif args.parts is not None:  # how `init --part K/N` splits the shards
                check_parts(args.parts)  # a bad --parts or --rate fails before planning
                rate = parse_rate(args.rate)
                print_parts(client.plan(args.spec, tensors=False, **kwargs), args.parts, rate)
            else:
                _print_plan(client.plan(args.spec, tensors=args.tensors, **kwargs), args.json, args.tensors)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    return 0


def _probe(args: argparse.Namespace) -> int:
    from .server_extra import probe_report
    from .probing import probe

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
        results = probe(args.spec, policies=policies, seed=args.seed, architecture=args.architecture,
                        batch=args.batch, seq=args.seq, memory_budget=budget, proxy=args.proxy)
    except ModelInitError as e:
        return _fail(e.details, 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1)
    return _probe_output(args, results, report.plot, to_json, report.render)


def _coord_check(args: argparse.Namespace, policies: list[str | None], budget: int | None) -> int:
    """``modelinit probe SPEC --widths ...``: the coordinate check (docs/probe.md)."""
    from .probing import coord_check
    from .server_extra import coord_report

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


def _serve(args: argparse.Namespace) -> int:
    return server_extra.serve(args, _fail)


def _finalize(args: argparse.Namespace) -> int:
    """``modelinit finalize URL``: 0 complete, 3 parts still missing (nothing written; rerun it
    later), 2 bad input, 1 the environment."""
    try:
        with (connect(args) if args.server else Client(device=args.device)) as client:
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


def _verify(args: argparse.Namespace) -> int:
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


def _print_plan(plan, as_json: bool, tensors: bool = True) -> None:
    if as_json:
        from google.protobuf import json_format

        doc = json_format.MessageToDict(plan, preserving_proto_field_name=True)
        doc.setdefault("request", {})["policy"] = _policy_doc(plan)  # the policy-file format, as modelinit.json
        print(json.dumps(doc, indent=2))
        return
    print(f"{plan.architecture} ({plan.family}): {plan.total_params:,} parameters, {plan.total_bytes:,} bytes, "
          f"{sum(f.shard for f in plan.files)} shard(s); algorithm v{plan.algorithm_version}; fingerprint {plan.fingerprint}")
    if not tensors:
        rows: list[tuple[str, ...]] = [(f.name, f"{f.size:,}", str(f.tensors) if f.shard else "-") for f in plan.files]
        _print_table(("file", "bytes", "tensors"), rows)
        print(f"\n{plan.tensor_count:,} tensors in {len(plan.groups)} groups (--tensors lists them, `modelinit explain` shows the groups)")
        return
    rows = [(t.name, "x".join(map(str, t.shape)), t.init, f"{t.effective_std:.4g}", t.rule, plan.files[t.shard].name) for t in plan.tensors]
    _print_table(("tensor", "shape", "init", "eff. std", "rule", "file"), rows)


def _policy_doc(plan) -> dict:
    """The plan's (normalized) policy in the policy-file format: `--policy` takes it back."""
    from google.protobuf import json_format

    try:
        return to_dict(plan.request.policy)
    except ValueError:  # a server echoing what no policy file holds: show it as it came
        return json_format.MessageToDict(plan.request.policy, preserving_proto_field_name=True)


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
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


def policy_title(given: str | None, policy) -> str:
    """How ``explain`` names the policy: by what ``--policy`` gave (``given``), with what the
    request's ``policy`` message holds: ``policy hf-default``, ``policy file p.yaml (custom rules
    + preset gpt2)``, ``custom rules + preset gpt2``."""
    preset = policy.preset
    content = " + ".join(filter(None, ["custom rules" if policy.rules else "", f"preset {preset}" if preset else ""]))
    if given is not None and (looks_like_file(given) or os.path.isfile(given)):  # as model_policy() tells them apart
        return f"policy file {given} ({content or 'preset hf-default'})"
    return content if policy.rules else f"policy {preset or 'hf-default'}"


def _print_explain(plan, as_json: bool, given_policy: str | None = None) -> None:
    if as_json:
        from google.protobuf import json_format

        # Fields at their default (0, empty) are printed too, so every group has the same keys, and
        # in proto field order (MessageToDict would put the defaulted ones last).
        def as_dict(g) -> dict:
            d = json_format.MessageToDict(g, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            return {f.name: d[f.name] for f in g.DESCRIPTOR.fields}

        groups = [as_dict(g) for g in plan.groups]
        print(json.dumps({"policy": _policy_doc(plan), "groups": groups, "summary": explain_summary(plan)}, indent=2))
        return
    print(f"{plan.architecture} ({plan.family}), {policy_title(given_policy, plan.request.policy)}:")
    # the first tensor tells apart groups of one rule and shape (BERT's token-type embedding and NSP head)
    rows = [(g.rule, f"{g.count} x {'x'.join(map(str, g.shape))}", g.example, g.init, f"{g.effective_std:.4g}",
             _ref(g.xavier_std, ".4g"), _ref(g.lecun_std, ".4g"), _ref(g.ratio_lecun, ".3g"), g.formula) for g in plan.groups]
    _print_table(("rule", "tensors", "first tensor", "init", "eff. std", "xavier std", "lecun std", "std/lecun", "formula"),
                 rows)
    print("xavier std = sqrt(2/(fan_in+fan_out)); lecun std = 1/sqrt(fan_in); std/lecun = eff. std / lecun std "
          "(1: the fan-in scale; '-': not a fan-based tensor)")
    if plan.request.policy.preset == "mup":  # the half of µP the weights do not hold
        print(f"learning rates (µP; the optimizer's, not in the weights; `modelinit probe --widths` applies them, "
              f"docs/probe.md): Adam: hidden matrices LR · {MUP_BASE_WIDTH}/width, vector-like (embeddings, readout, "
              f"norms, biases) LR; SGD: hidden matrices LR, vector-like LR · width/{MUP_BASE_WIDTH}; the readout's "
              f"output x {MUP_BASE_WIDTH}/width in the forward pass")
    warnings = [f"{_group_label(g)}: {w}" for g in plan.groups for w in g.warnings]
    if warnings:
        print("\nwarnings:")
        for w in warnings:
            print(f"  {w}")
    s = explain_summary(plan)
    print(f"\n{s['total_params']:,} parameters in {s['groups']} groups; {s['warnings']} warning(s)")


def run() -> NoReturn:
    """The ``modelinit`` console script: :func:`main`, then the process ends without the
    interpreter's teardown. Once numba's kernels are loaded, tearing down its object graph (LLVM
    modules, type registries) takes 0.1-0.25 s of a 3.4 s job (tinyllama-1.1b on 2 cores), for
    nothing: the output is written, renamed and reported by then. What an exit must still do is
    done here: the exit handlers run (logging's flush among them) and stdout and stderr are
    flushed. With a non-daemon thread still alive the exit is the ordinary one, which waits for it."""
    code = main()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a reader gone, a stream closed: nothing more to say there
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
