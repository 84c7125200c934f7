"""Everything modelinit keeps in an output folder, and the format it keeps it in.

``modelinit.json`` (written last: a folder that has it is complete) records what was asked (the
request, replayable), what made it (algorithm version, fingerprint, transformers version) and
every file with its size and SHA-256; ``.modelinit.progress.json`` records an unfinished run in
the same file format. This module reads and writes both (:func:`manifest_bytes`,
:func:`progress_bytes`, :func:`read_record`, :func:`read_manifest`), turns a manifest back into
its request (:func:`manifest_request`), compares a plan with it (:func:`plan_differences`), and
says which names a folder may hold (:func:`check_file_name`, :func:`loader_file`).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, TypeGuard

import grpc
from google.protobuf import json_format
from modelinit_wire import policy_file
from modelinit_wire.v1 import modelinit_pb2 as pb

from .errors import ModelInitError
from .handoff import FileResult

if TYPE_CHECKING:
    from .bucket import Bucket

MANIFEST_FILE = "modelinit.json"
PROGRESS_FILE = ".modelinit.progress.json"
"""The hidden record of an unfinished ``init_model``: its fingerprint, the files already renamed
into place with their SHA-256 (a rerun of the same weights keeps those that still match), and
the files of an earlier run still to be deleted. Removed once ``modelinit.json`` is written."""
MAX_NAME_BYTES = 200
"""Longest file name taken from a server, in UTF-8 bytes: filesystems allow 255, and the temp
file ``.NAME.partial`` adds 9."""
MAX_RECORD_BYTES = 64 << 20
"""Largest ``modelinit.json`` or progress record read (one listing 270 shards, with its spec and
policy, is well under 1 MiB): a larger one is refused unread, so a damaged or planted file cannot
take the client's memory."""
#: What a loader (transformers, safetensors, torch) may read from a model folder: weights, their
#: indexes, the model config. Such a file that no modelinit run recorded is "foreign": init_model
#: refuses to write beside it unless ``overwrite``. Anything else (tokenizer files, README, other
#: JSON, subfolders) is the user's and is left alone.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def local_folder(path: str | os.PathLike, field: str) -> pathlib.Path:
    """The local folder ``path`` names: a path, or a ``file://`` URL. Any other URL is refused with
    INVALID_ARGUMENT naming ``field``, before anything is planned or written (it would otherwise
    become a local folder called ``hf:``); callers that take object-store prefixes
    (:func:`modelinit.bucket.is_bucket_url`) handle those first."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    m = _URL.match(text)
    if m is None:
        return pathlib.Path(text)
    scheme = m.group(1).lower()
    if scheme == "file":
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"{field}: {text!r} is not a local file URL; use file:///absolute/path")
        return pathlib.Path(unquote(parts.path))
    raise ModelInitError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{field}: {scheme}:// is not a location this version can use; give a local folder, a file:// "
                         "URL or an object-store prefix (s3://, gs://, az://)")


_LOADER_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".index.json")
_LOADER_NAMES = frozenset({"config.json"})
READ_SIZE = 8 << 20
"""Bytes per read while hashing."""
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def check_file_name(name: str) -> str:
    """Refuse any server-supplied name that could write outside the output folder, replace what
    modelinit keeps there (``modelinit.json``; hidden names: temp files, the progress record, the
    lock) or that a filesystem may not take (over ``MAX_NAME_BYTES``)."""
    why = None
    if not name or name in (".", "..") or any(c in name for c in "/\\\0:") or os.path.isabs(name):
        why = "it could write outside the output folder"
    elif name.startswith("."):
        why = "hidden names are modelinit's own: temp files, progress record, lock"
    elif name.casefold() == MANIFEST_FILE:
        why = f"{MANIFEST_FILE} is the manifest modelinit writes itself"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        why = f"longer than {MAX_NAME_BYTES} bytes"
    if why is not None:
        shown = name if len(name) <= 80 else f"{name[:60]}...{name[-12:]}"
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"server sent an unsafe file name {shown!r} ({why}); refusing to write it")
    return name


def loader_file(name: str) -> bool:
    """Whether a loader may read ``name`` from a model folder: weights, an index, config.json
    (hidden names aside)."""
    return not name.startswith(".") and (name in _LOADER_NAMES or name.endswith(_LOADER_SUFFIXES))


def check_plan_names(plan: pb.PlanResponse) -> None:
    """Every planned name safe, and none twice (nor twice but for case)."""
    seen: set[str] = set()
    for f in plan.files:
        check_file_name(f.name)
        if f.name.casefold() in seen:
            raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"server planned the file {f.name!r} twice; refusing to write it")
        seen.add(f.name.casefold())


@dataclass(frozen=True)
class Record:
    """What a ``modelinit.json`` or a progress record in the folder says, leniently read."""

    fingerprint: str
    algorithm_version: int
    files: tuple[FileResult, ...]
    """Files the run finished, with their SHA-256 (safe plain names only)."""
    stale: tuple[str, ...] = ()
    """Files of an earlier run a progress record's run was deleting."""


class _NotSmallFile(OSError):
    """Not a regular file of at most :data:`MAX_RECORD_BYTES`."""


def read_small_file(path: pathlib.Path, limit: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (a link to one is followed); an OSError for anything
    else: a folder, a FIFO or device (opened without blocking, never read), a file over ``limit``
    bytes (not read past it), a link loop."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _NotSmallFile("not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _NotSmallFile(f"larger than {limit} bytes, not read")
    return data


def read_record(path: pathlib.Path) -> "Record | None":
    """The record at ``path``; None when it cannot be read as one."""
    try:
        data = read_small_file(path)
    except OSError:
        return None
    return parse_record(data)


def parse_record(data: bytes) -> "Record | None":
    """A record's bytes, leniently read; None when they are not one."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None

    def safe(name: object) -> bool:
        try:
            return isinstance(name, str) and check_file_name(name) == name
        except ModelInitError:
            return False

    raw_files, raw_stale = doc.get("files"), doc.get("stale")
    files = raw_files if isinstance(raw_files, list) else []
    stale = raw_stale if isinstance(raw_stale, list) else []
    fingerprint, version = doc.get("fingerprint"), doc.get("algorithm_version")
    return Record(
        fingerprint if isinstance(fingerprint, str) else "",
        version if type(version) is int else -1,
        tuple(FileResult(f["name"], f["size"], f["sha256"]) for f in files
              if isinstance(f, dict) and safe(f.get("name")) and type(f.get("size")) is int and isinstance(f.get("sha256"), str)),
        tuple(n for n in stale if safe(n)),
    )


def progress_bytes(plan: pb.PlanResponse, files: Iterable[FileResult], stale: list[str]) -> bytes:
    """A progress record: the plan's fingerprint and algorithm version, the files finished (with
    their SHA-256) and the files of an earlier run still to be deleted."""
    doc = {
        "fingerprint": plan.fingerprint,
        "algorithm_version": plan.algorithm_version,
        "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in files],
        "stale": stale,
    }
    return (json.dumps(doc, indent=1) + "\n").encode()


def manifest_bytes(plan: pb.PlanResponse, written: list[FileResult]) -> bytes:
    """modelinit.json: what was asked, what algorithm made it, and every file's hash.
    ``request`` holds what replays the request exactly: its ``algorithm_version`` (the plan's,
    never 0) and the ``architecture`` override when one was given."""
    r = plan.request
    spec: dict[str, Any] = {"preset": r.spec.preset} if r.spec.HasField("preset") else {"config": json.loads(r.spec.config_json)}
    try:
        policy = policy_file.to_dict(r.policy)  # the policy-file format: `--policy` takes it back
    except ValueError as e:  # only a server that echoes a policy it could not have planned
        raise ModelInitError(grpc.StatusCode.DATA_LOSS, f"plan: the server echoed a malformed {e}") from None
    request: dict[str, Any] = {
        "spec": spec,
        "policy": policy,
        "seed": r.seed,
        "dtype": r.dtype,
        "max_shard_size": int(r.max_shard_size),
        "algorithm_version": plan.algorithm_version,
    }
    if r.spec.architecture:
        request["architecture"] = r.spec.architecture
    doc = {
        "algorithm_version": plan.algorithm_version,
        "fingerprint": plan.fingerprint,
        "family": plan.family,
        "architecture": plan.architecture,
        "total_params": plan.total_params,
        "total_bytes": plan.total_bytes,
        "transformers_version": plan.transformers_version,
        "request": request,
        "files": [{"name": w.name, "size": w.size, "sha256": w.sha256} for w in written],
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def _bad_manifest(where: str, what: str) -> ModelInitError:
    return ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"{where}: malformed manifest: {what}")


def _is_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def read_manifest(path: str | os.PathLike, field: str = "manifest") -> dict:
    """The folder's ``modelinit.json``, checked for shape (:func:`parse_manifest`). Raises
    ModelInitError(FAILED_PRECONDITION) when the folder is not a directory, has no manifest, or the
    manifest is malformed (naming what is wrong). ``path`` may also be the manifest file itself
    (``DIR/modelinit.json``), or an object-store prefix (``s3://bucket/prefix``, or
    ``s3://bucket/prefix/modelinit.json``: :func:`read_bucket_manifest`); any other URL is refused
    with INVALID_ARGUMENT naming ``field``."""
    from .bucket import Bucket, is_bucket_url  # the object-store extra is loaded only for a URL

    if is_bucket_url(path):
        return read_bucket_manifest(Bucket(manifest_prefix(path), field))
    folder = local_folder(path, field)
    if folder.is_file():
        file = folder  # the manifest file itself (errors name it)
    elif not folder.is_dir():
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, f"{str(folder)!r} is not a directory")
    else:
        file = folder / MANIFEST_FILE
    try:
        text = read_small_file(file).decode("utf-8")
    except FileNotFoundError:
        raise ModelInitError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{folder} has no {MANIFEST_FILE}: not a complete modelinit folder (an interrupted run leaves none)",
        ) from None
    except _NotSmallFile as e:
        raise _bad_manifest(str(file), str(e)) from None
    except OSError as e:
        raise _bad_manifest(str(file), f"cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise _bad_manifest(str(file), f"not UTF-8 ({e.reason} at byte {e.start})") from None
    return parse_manifest(text, str(file))


def manifest_prefix(url: str | os.PathLike) -> str:
    """The object-store prefix a URL names: the URL itself, or its parent when it names the
    manifest (``s3://bucket/prefix/modelinit.json``)."""
    text = os.fsdecode(os.fspath(url)).rstrip("/")
    head, sep, last = text.rpartition("/")
    return head if sep and last == MANIFEST_FILE and not head.endswith(":/") else text


def read_bucket_manifest(bucket: "Bucket") -> dict:
    """The ``modelinit.json`` of an object-store prefix, checked for shape (:func:`parse_manifest`).
    FAILED_PRECONDITION when the prefix has none (a run still uploading, or killed, leaves none:
    it is written last), when it is malformed, or when the bucket does not exist; other store
    errors as :meth:`Bucket.error <modelinit.bucket.Bucket.error>` makes them."""
    try:
        data = bucket.read(MANIFEST_FILE, limit=MAX_RECORD_BYTES)
    except ModelInitError as e:
        if e.code != grpc.StatusCode.NOT_FOUND:
            raise
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION, e.details) from None
    if data is None:
        raise ModelInitError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"{bucket.url}: has no {MANIFEST_FILE}: not a complete checkpoint (an unfinished or partial "
                             "run leaves none)")
    return parse_manifest(data, f"{bucket.url}/{MANIFEST_FILE}")


def parse_manifest(text: str | bytes, where: str) -> dict:
    """A ``modelinit.json``'s text, checked for shape (fields, types, safe file names, a request
    that parses); ``where`` names it in errors (FAILED_PRECONDITION, naming what is wrong)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _bad_manifest(where, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _bad_manifest(where, "not a JSON object")
    if not _is_int(doc.get("algorithm_version")) or doc["algorithm_version"] < 0:
        raise _bad_manifest(where, "algorithm_version: missing or not a non-negative integer")
    if not isinstance(doc.get("fingerprint"), str) or not doc["fingerprint"]:
        raise _bad_manifest(where, "fingerprint: missing or not a string")
    files = doc.get("files")
    if not isinstance(files, list):
        raise _bad_manifest(where, "files: missing or not a list")
    seen = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict):
            raise _bad_manifest(where, f"files[{i}]: not an object")
        name = f.get("name")
        if not isinstance(name, str):
            raise _bad_manifest(where, f"files[{i}].name: missing or not a string")
        try:
            check_file_name(name)
        except ModelInitError:
            raise _bad_manifest(where, f"files[{i}].name: unsafe file name {name!r} (must be a plain name inside the folder)") from None
        if name == MANIFEST_FILE or name in seen:
            raise _bad_manifest(where, f"files[{i}].name: {name!r} listed twice or names the manifest itself")
        seen.add(name)
        if not _is_int(f.get("size")) or f["size"] < 0:
            raise _bad_manifest(where, f"files[{i}].size: missing or not a non-negative integer")
        if not isinstance(f.get("sha256"), str) or not _SHA_RE.match(f["sha256"]):
            raise _bad_manifest(where, f"files[{i}].sha256: missing or not 64 lowercase hex digits")
    try:
        manifest_request(doc)
    except ValueError as e:
        raise _bad_manifest(where, str(e)) from None
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
    (:func:`modelinit_wire.policy_file.to_dict`, what ``modelinit.json`` holds now), or the proto3 JSON
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


def sha256_file(path: pathlib.Path, tick: Callable[[int], None] = lambda n: None) -> str:
    h = hashlib.sha256()
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
            tick(n)
    return h.hexdigest()


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
        elif manifest_request(manifest).policy.preset == "torchtitan-llama3" and not manifest_request(manifest).policy.rules:
            why = (" (the 'torchtitan-llama3' preset used to give a tied token embedding N(0, 1), and now gives it the output "
                   "layer's law, as torchtitan's tied models do; a tied model made before regenerates with the policy "
                   "{preset: torchtitan-llama3, rules: [{match: {roles: [token_embedding]}, init: {normal: {std: 1}}}]})")
        out.append(f"fingerprint {manifest['fingerprint']}, the recorded request regenerates {plan.fingerprint}{why}")
    planned = [(f.name, f.size) for f in plan.files]
    recorded = [(e["name"], e["size"]) for e in manifest["files"]]
    if planned != recorded:
        out.append(f"files {_describe(recorded)}, the recorded request regenerates {_describe(planned)}")
    return out


def _describe(files: Iterable[tuple[str, int]]) -> str:
    return "[" + ", ".join(f"{n} ({s} bytes)" for n, s in files) + "]"
