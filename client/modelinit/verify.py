"""Check a finished output folder: every file's size and SHA-256, the safetensors headers, the
index, leftovers, and (optionally) that (spec, policy, seed) still regenerate the same bytes.

``modelinit verify DIR`` is :func:`verify_folder` on the command line; :func:`is_complete` is the
cheap question "is this folder already exactly what this plan writes?". Stdlib, grpc and
protobuf only: no torch, no numpy, no safetensors library.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import struct
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import grpc
from google.protobuf import json_format

from . import policy_file
from .client import MANIFEST_FILE, _progress_bar, check_file_name, loader_file
from .errors import ModelInitError
from .events import Begin, Data, End
from .v1 import modelinit_pb2 as pb

INDEX_FILE = "model.safetensors.index.json"
READ_SIZE = 8 << 20
"""Bytes per read while hashing."""
_MAX_HEADER = 100 << 20  # the safetensors format's own limit on the JSON header
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}


@dataclass(frozen=True)
class FileCheck:
    """One file of the manifest, as found on disk."""

    name: str
    """File name inside the folder, as the manifest lists it."""
    expected_size: int
    """Size in bytes the manifest records."""
    size: int | None
    """Size on disk; None when the file is missing."""
    expected_sha256: str
    """Hex SHA-256 the manifest records."""
    sha256: str | None
    """Hex SHA-256 of the file on disk; None when not computed (missing or unreadable file)."""
    problem: str | None
    """What is wrong with this file ("; "-joined when several things are); None when it is fine."""

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Report:
    """The outcome of :func:`verify_folder`."""

    path: pathlib.Path
    """The folder verified."""
    fingerprint: str
    """The manifest's fingerprint (identifies the weights)."""
    algorithm_version: int
    """The manifest's generation algorithm version."""
    files: tuple[FileCheck, ...]
    """Every file the manifest lists, in manifest order."""
    problems: tuple[str, ...]
    """Every problem found, each starting with the file (or ``modelinit.json``) it concerns;
    the files' own problems come first."""
    regenerated: bool = False
    """True when the bytes were regenerated from the manifest's request and compared."""
    notes: tuple[str, ...] = ()
    """Things worth knowing that are not failures (e.g. regeneration skipped)."""

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields, ``path`` as a string, and ``ok``."""
        d = dataclasses.asdict(self)
        d["path"] = str(self.path)
        d["ok"] = self.ok
        return d


def _bad_manifest(path: pathlib.Path, what: str) -> ModelInitError:
    file = path if path.is_file() else path / MANIFEST_FILE  # a folder, or the manifest file itself
    return ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"{file}: malformed manifest: {what}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_manifest(path: str | os.PathLike) -> dict:
    """The folder's ``modelinit.json``, checked for shape (fields, types, safe file names, a
    request that parses). Raises ModelInitError(FAILED_PRECONDITION) when the folder is not a
    directory, has no manifest, or the manifest is malformed (naming what is wrong). ``path``
    may also be the manifest file itself (``DIR/modelinit.json``)."""
    folder = pathlib.Path(path)
    if folder.is_file():
        file = folder  # the manifest file itself (errors name it)
    elif not folder.is_dir():
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"{str(folder)!r} is not a directory")
    else:
        file = folder / MANIFEST_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelInitError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{folder} has no {MANIFEST_FILE}: not a complete modelinit folder (an interrupted run leaves none)",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise _bad_manifest(folder, f"cannot read it: {e}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad_manifest(folder, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _bad_manifest(folder, "not a JSON object")
    if not _is_int(doc.get("algorithm_version")) or doc["algorithm_version"] < 0:
        raise _bad_manifest(folder, "algorithm_version: missing or not a non-negative integer")
    if not isinstance(doc.get("fingerprint"), str) or not doc["fingerprint"]:
        raise _bad_manifest(folder, "fingerprint: missing or not a string")
    files = doc.get("files")
    if not isinstance(files, list):
        raise _bad_manifest(folder, "files: missing or not a list")
    seen = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise _bad_manifest(folder, f"files[{i}]: not an object")
        name = f.get("name")
        if not isinstance(name, str):
            raise _bad_manifest(folder, f"files[{i}].name: missing or not a string")
        try:
            check_file_name(name)
        except ModelInitError:
            raise _bad_manifest(folder, f"files[{i}].name: unsafe file name {name!r} (must be a plain name inside the folder)") from None
        if name == MANIFEST_FILE or name in seen:
            raise _bad_manifest(folder, f"files[{i}].name: {name!r} listed twice or names the manifest itself")
        seen.add(name)
        if not _is_int(f.get("size")) or f["size"] < 0:
            raise _bad_manifest(folder, f"files[{i}].size: missing or not a non-negative integer")
        if not isinstance(f.get("sha256"), str) or not _SHA_RE.match(f["sha256"]):
            raise _bad_manifest(folder, f"files[{i}].sha256: missing or not 64 lowercase hex digits")
    try:
        manifest_request(doc)
    except ValueError as e:
        raise _bad_manifest(folder, str(e)) from None
    return doc


def manifest_request(manifest: dict) -> pb.ModelRequest:
    """The ModelRequest a manifest's ``request`` records (what regenerates the folder).
    Raises ValueError naming the malformed field."""
    r = manifest.get("request")
    if not isinstance(r, dict):
        raise ValueError("request: missing or not an object")
    spec = r.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("preset"), str) and "config" not in spec:
        model_spec = pb.ModelSpec(preset=spec["preset"])
    elif isinstance(spec, dict) and isinstance(spec.get("config"), dict) and "preset" not in spec:
        model_spec = pb.ModelSpec(config_json=json.dumps(spec["config"]))
    else:
        raise ValueError("request.spec: must be {\"preset\": name} or {\"config\": {...}}")
    policy_msg = manifest_policy(r.get("policy", {}))
    seed = r.get("seed")
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError("request.seed: missing or not an integer in [0, 2^64)")
    dtype = r.get("dtype", "")
    if not isinstance(dtype, str):
        raise ValueError("request.dtype: not a string")
    shard = r.get("max_shard_size")
    if not _is_int(shard) or shard <= 0:
        raise ValueError("request.max_shard_size: missing or not a positive integer")
    # Manifests older than algorithm version 2 record the version only at the top level.
    version = r.get("algorithm_version", manifest.get("algorithm_version"))
    if not _is_int(version) or not 1 <= version < 2**32:
        raise ValueError("request.algorithm_version: missing or not a version number (>= 1)")
    if _is_int(manifest.get("algorithm_version")) and version != manifest["algorithm_version"]:
        raise ValueError(f"request.algorithm_version: {version}, but the top-level algorithm_version is "
                         f"{manifest['algorithm_version']}")
    architecture = r.get("architecture", "")
    if not isinstance(architecture, str):
        raise ValueError("request.architecture: not a string (a model class name)")
    model_spec.architecture = architecture
    return pb.ModelRequest(spec=model_spec, policy=policy_msg, seed=seed, dtype=dtype, max_shard_size=str(shard),
                           algorithm_version=version)


def manifest_policy(policy: Any) -> pb.Policy:
    """The Policy a manifest's ``request.policy`` records: the policy-file format
    (:func:`modelinit.policy_file.to_dict`, what ``modelinit.json`` holds now), or the proto3 JSON
    mapping that earlier manifests hold (enum names such as ``DEPTH_SCALING_N_LAYERS``,
    ``BOUNDS_ABSOLUTE``; infinities as strings). The two agree wherever both parse. Raises
    ValueError (starting with ``request.policy``) for neither."""
    if not isinstance(policy, dict):
        raise ValueError("request.policy: not an object")
    try:
        return policy_file.from_dict(policy)
    except ValueError as e:
        error = e
    try:
        return json_format.ParseDict(policy, pb.Policy())  # a manifest written before the policy-file format
    except (json_format.ParseError, TypeError, ValueError, RecursionError):
        raise ValueError(f"request.{error}") from None


def _sha256_file(path: pathlib.Path, tick: Callable[[int], None] = lambda n: None) -> str:
    h = hashlib.sha256()
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            tick(n)
    return h.hexdigest()


def _check_header(path: pathlib.Path, size: int, fingerprint: str) -> tuple[list[str], dict[str, int] | None]:
    """Problems of a safetensors file's header, and its tensors' byte counts (None if unparsable)."""
    if size < 8:
        return [f"safetensors header: file has {size} bytes, too short for the 8-byte header length"], None
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > size - 8 or n > _MAX_HEADER:
            return [f"safetensors header: header length {n} does not fit in the {size}-byte file"], None
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        return [f"safetensors header: not valid UTF-8 JSON ({e})"], None
    if not isinstance(header, dict):
        return ["safetensors header: not a JSON object"], None
    problems: list[str] = []
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        problems.append("safetensors header: __metadata__ is not a string-to-string map")
    elif "modelinit.fingerprint" in meta and meta["modelinit.fingerprint"] != fingerprint:
        problems.append(f"safetensors header: fingerprint {meta['modelinit.fingerprint']}, manifest says {fingerprint}")
    tensors: dict[str, int] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            problems.append(f"tensor {name!r}: entry is not an object")
            continue
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _ITEMSIZE:
            problems.append(f"tensor {name!r}: unknown dtype {dtype!r}")
            continue
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            problems.append(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
            continue
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            problems.append(f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
            continue
        count = 1
        for d in shape:
            count *= d
        nbytes = count * _ITEMSIZE[dtype]
        if offsets[1] - offsets[0] != nbytes:
            problems.append(f"tensor {name!r}: {dtype} {shape} needs {nbytes} bytes, data_offsets span {offsets[1] - offsets[0]}")
        tensors[name] = nbytes
        spans.append((offsets[0], offsets[1], name))
    data_size = size - 8 - n
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            what = "overlaps the previous tensor" if begin < pos else f"leaves a gap of {begin - pos} bytes before it"
            problems.append(f"tensor {name!r}: data starts at {begin}, expected {pos} ({what})")
        pos = max(pos, end)
    if pos != data_size:
        problems.append(f"safetensors header: tensor data ends at {pos}, the file's data section has {data_size} bytes")
    return problems, (tensors if not problems else None)


def _check_index(path: pathlib.Path, shards: dict[str, dict[str, int] | None], manifest_names: set[str]) -> list[str]:
    """Problems of model.safetensors.index.json against the shards' headers (name -> tensor bytes)."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        return [f"not readable JSON ({e})"]
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return ["weight_map: missing or not a tensor-to-file map"]
    problems = []
    for shard in sorted(set(weight_map.values())):
        if shard not in manifest_names or not shard.endswith(".safetensors"):
            problems.append(f"weight_map names {shard!r}, not a shard of this folder's manifest")
        elif not (path.parent / shard).is_file():
            problems.append(f"weight_map names {shard!r}, which does not exist")
    if all(t is not None for t in shards.values()):  # only when every header could be read
        found = {name: shard for shard, tensors in shards.items() for name in tensors}  # type: ignore[union-attr]
        for name in sorted(set(weight_map) - set(found)):
            problems.append(f"weight_map lists tensor {name!r}, which no shard holds")
        for name in sorted(set(found) - set(weight_map)):
            problems.append(f"weight_map misses tensor {name!r} (in {found[name]})")
        for name in sorted(set(found) & set(weight_map)):
            if weight_map[name] != found[name]:
                problems.append(f"weight_map puts tensor {name!r} in {weight_map[name]}, it is in {found[name]}")
        meta = index.get("metadata")
        total = meta.get("total_size") if isinstance(meta, dict) else None
        expected = sum(n for tensors in shards.values() for n in tensors.values())  # type: ignore[union-attr]
        if total is not None and total != expected:
            problems.append(f"metadata.total_size is {total}, the shards hold {expected} tensor bytes")
    return problems


def _embedded_client(device: str = "auto"):
    """An embedded Client, or None when the server extra is not installed."""
    from .client import Client

    try:
        return Client(device=device)
    except ModelInitError as e:
        if e.code == grpc.StatusCode.FAILED_PRECONDITION:
            return None
        raise


def verify_folder(
    path: str | os.PathLike,
    *,
    client=None,
    regenerate: bool = True,
    progress: bool | Callable[[int], None] | None = None,
) -> Report:
    """Verify a finished output folder against its ``modelinit.json``; collects every problem.

    Checks every listed file's size and SHA-256, every shard's safetensors header (offsets
    contiguous to the file's end, byte counts matching dtype and shape), the index against the
    headers, and leftover ``.*.partial`` files. With ``regenerate`` the manifest's request is
    planned again (``client``, or an embedded one when the server extra is installed) and its
    fingerprint, algorithm version and files compared, then every file's bytes are regenerated
    and hashed: proof that (spec, policy, seed) still produce exactly these bytes.
    ``progress``: True for a bar on stderr, or a callable that gets byte counts.

    Raises ModelInitError(FAILED_PRECONDITION) when the folder or its manifest is missing or
    malformed; errors reaching the server (e.g. UNAVAILABLE) are raised too.
    """
    folder = pathlib.Path(path)
    manifest = read_manifest(folder)
    fingerprint, version = manifest["fingerprint"], manifest["algorithm_version"]
    entries = manifest["files"]
    names = {e["name"] for e in entries}
    file_problems: dict[str, list[str]] = {e["name"]: [] for e in entries}
    problems: list[str] = []
    notes: list[str] = []

    own_client = None
    if regenerate and client is None:
        client = own_client = _embedded_client()
        if client is None:
            notes.append("regeneration skipped: the server extra is not installed and no server was given")
    regenerating = regenerate and client is not None
    total = sum(e["size"] for e in entries) * (2 if regenerating else 1)
    bar = _progress_bar(progress or False, total)
    try:
        # 1. Every file on disk: size, SHA-256, headers.
        sizes: dict[str, int | None] = {}
        hashes: dict[str, str | None] = {}
        headers: dict[str, dict[str, int] | None] = {}
        for e in entries:
            name, p = e["name"], folder / e["name"]
            mine = file_problems[name]
            try:
                st = p.stat()
            except FileNotFoundError:
                sizes[name] = hashes[name] = None
                mine.append(f"missing (manifest lists {e['size']} bytes)")
                continue
            if not p.is_file():
                sizes[name] = hashes[name] = None
                mine.append("not a regular file")
                continue
            sizes[name] = st.st_size
            if st.st_size != e["size"]:
                mine.append(f"size {st.st_size} bytes, manifest says {e['size']}")
            try:
                hashes[name] = _sha256_file(p, bar)
            except OSError as err:
                hashes[name] = None
                mine.append(f"cannot read: {err}")
                continue
            if hashes[name] != e["sha256"]:
                mine.append(f"SHA-256 {hashes[name]}, manifest says {e['sha256']}")
            if name.endswith(".safetensors"):
                header_problems, headers[name] = _check_header(p, st.st_size, fingerprint)
                mine.extend(header_problems)
        for e in entries:
            if e["name"].endswith(".safetensors") and e["name"] not in headers:
                headers[e["name"]] = None  # missing or unreadable
        if INDEX_FILE in names and sizes.get(INDEX_FILE) is not None:
            file_problems[INDEX_FILE].extend(_check_index(folder / INDEX_FILE, headers, names))

        # 2. The folder: leftovers of an interrupted run, shards of another run.
        for child in sorted(folder.iterdir()):
            if child.name.startswith(".") and child.name.endswith(".partial"):
                problems.append(f"{child.name}: leftover temp file of an interrupted run")
            elif loader_file(child.name) and child.name not in names:  # what init_model calls foreign
                problems.append(f"{child.name}: not in the manifest (left over from another run?)")

        # 3. Regenerate from (spec, policy, seed) and compare.
        regenerated = False
        if regenerating:
            regenerated = _regenerate(client, manifest, file_problems, problems, notes, bar)
    finally:
        bar(None)
        if own_client is not None:
            own_client.close()

    checks = tuple(
        FileCheck(e["name"], e["size"], sizes[e["name"]], e["sha256"], hashes[e["name"]],
                  "; ".join(file_problems[e["name"]]) or None)
        for e in entries
    )
    all_problems = [f"{name}: {p}" for name, ps in file_problems.items() for p in ps] + problems
    return Report(folder, fingerprint, version, checks, tuple(all_problems), regenerated, tuple(notes))


def plan_differences(manifest: dict, plan: pb.PlanResponse) -> list[str]:
    """How the plan of a manifest's recorded request differs from the manifest (algorithm version,
    fingerprint, files), one sentence each, with a likely cause where one is known; empty when
    the plan makes exactly the recorded files."""
    out = []
    if plan.algorithm_version != manifest["algorithm_version"]:
        out.append(f"algorithm_version {manifest['algorithm_version']}, the server makes "
                   f"{plan.algorithm_version} (it cannot reproduce these bytes)")
    if plan.fingerprint != manifest["fingerprint"]:
        why = ""
        recorded_tf = manifest.get("transformers_version")
        if isinstance(recorded_tf, str) and recorded_tf != plan.transformers_version:
            why = (f" (the manifest was made with transformers {recorded_tf or '(none: built-in family)'}, the server "
                   f"resolves the architecture with {plan.transformers_version or '(none: built-in family)'})")
        elif manifest_request(manifest).policy.preset == "kaiming":
            why = (" (the 'kaiming' preset used to be LeCun normal, std 1/sqrt(fan_in), and is now torch's kaiming_normal_ "
                   "default, std sqrt(2/fan_in); a folder made with the old 'kaiming' regenerates with the preset 'lecun-normal')")
        out.append(f"fingerprint {manifest['fingerprint']}, the recorded request regenerates {plan.fingerprint}{why}")
    planned = [(f.name, f.size) for f in plan.files]
    recorded = [(e["name"], e["size"]) for e in manifest["files"]]
    if planned != recorded:
        out.append(f"files {_describe(recorded)}, the recorded request regenerates {_describe(planned)}")
    return out


def _regenerate(client, manifest: dict, file_problems: dict[str, list[str]], problems: list[str],
                notes: list[str], tick: Callable[[int], None]) -> bool:
    """Plan and stream the manifest's request; record what differs. True when bytes were compared."""
    request = manifest_request(manifest)
    try:
        plan = client._plan(request)
    except ModelInitError as e:
        # INVALID_ARGUMENT, or a server too old for the recorded algorithm version (it plans another).
        if not (e.code == grpc.StatusCode.INVALID_ARGUMENT
                or (e.code == grpc.StatusCode.FAILED_PRECONDITION and e.details.startswith("algorithm_version:"))):
            raise
        problems.append(f"{MANIFEST_FILE}: the server rejects the recorded request: {e.details}")
        return False
    differences = plan_differences(manifest, plan)
    if differences:
        problems.extend(f"{MANIFEST_FILE}: {d}" for d in differences)
        notes.append("bytes not regenerated: the plan already differs from the manifest")
        return False

    expected = {e["name"]: e["sha256"] for e in manifest["files"]}
    done: list[str] = []
    current = None  # (name, hasher, size)
    source = client._events(request, plan)
    try:
        for event in source:
            if isinstance(event, Data):
                if current is None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "regenerate: data before any file began")
                n = memoryview(event.data).nbytes
                current[1].update(event.data)
                current[2] += n
                tick(n)
            elif isinstance(event, Begin):
                if current is not None or event.offset != 0 or event.name not in expected:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"regenerate: unexpected file {event.name!r}")
                current = [event.name, hashlib.sha256(), 0]
            elif isinstance(event, End):
                if current is None:
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS, "regenerate: a file ended that never began")
                name, h, size = current
                got = h.hexdigest()
                if event.sha256 not in (None, got):
                    raise ModelInitError(grpc.StatusCode.DATA_LOSS,
                                         f"regenerate: {name}: received SHA-256 {got}, the server says {event.sha256}")
                if got != expected[name]:
                    file_problems[name].append(f"regenerated bytes have SHA-256 {got} ({size} bytes), "
                                               f"manifest says {expected[name]}")
                done.append(name)
                current = None
    finally:
        source.close()
    if done != [e["name"] for e in manifest["files"]]:
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"regenerate: stream ended after {len(done)} of {len(expected)} files")
    return True


def _describe(files: Iterable[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{n} ({s} bytes)" for n, s in files) + "]"


def is_complete(path: str | os.PathLike, fingerprint: str, algorithm_version: int, files: list[tuple[str, int]]) -> bool:
    """True only when the folder's ``modelinit.json`` has this fingerprint and algorithm version,
    lists exactly these (name, size) files, and every one exists with that size and the SHA-256
    the manifest records. False on anything else (never raises on a broken folder)."""
    try:
        folder = pathlib.Path(path)
        manifest = read_manifest(folder)
        if manifest["fingerprint"] != fingerprint or manifest["algorithm_version"] != algorithm_version:
            return False
        entries = manifest["files"]
        if sorted((e["name"], e["size"]) for e in entries) != sorted((str(n), int(s)) for n, s in files):
            return False
        for e in entries:
            p = folder / e["name"]
            if not p.is_file() or p.stat().st_size != e["size"]:
                return False
        return all(_sha256_file(folder / e["name"]) == e["sha256"] for e in entries)
    except Exception:  # a predicate over whatever is on disk: anything broken means "no"
        return False


def run_cli(args: argparse.Namespace) -> int:
    """``modelinit verify DIR``: 0 ok, 1 problems found (or the server failed), 2 bad input."""
    from .client import Client

    def fail(message: str, code: int) -> int:
        print(f"modelinit: error: {message}", file=sys.stderr)
        return code

    try:
        read_manifest(args.dir)  # bad input (no folder, no manifest) before starting anything
        client = None
        if args.regenerate:
            if args.server:
                from .cli import connect

                client = connect(args)
            else:
                client = _embedded_client(args.device)
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
