"""One checkpoint written by N pods: the Kubernetes Job (``modelinit job``) and the split it runs
(``modelinit plan --parts``).

``modelinit job SPEC --parts N --out s3://bucket/prefix`` prints a Kueue-admitted Indexed Job of N
pods; pod K runs ``modelinit init SPEC ... --out URL --part K/N`` and writes its byte-balanced
share of the shards (:func:`modelinit.parts.part_files`); whichever part finds every shard there
writes the index, config.json and modelinit.json. The same Job, as a Kustomize base, is
``deploy/k8s/init-job`` (docs/deploy.md, "One checkpoint from many pods").

Nothing here plans or generates: the module imports neither the server nor torch, so an
orchestrator can build Jobs with the thin client alone.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from typing import Any
from urllib.parse import urlsplit

import grpc
from modelinit_wire.constants import ALGORITHM_VERSIONS, DTYPES
from modelinit_wire.sizes import UNIT_NAMES, size_in_bytes, split_size

from . import store_secrets
from .bucket import SCHEMES, url_scheme
from .errors import ModelInitError
from .parts import MAX_PARTS, idle_note, split_shards

IMAGE = "registry.example.com/ml-platform/modelinit:0.1.0"
"""The server images of deploy/k8s/overlays (``-cpu``/``-cuda`` appended): ``modelinit init``
runs embedded in them. Their ENTRYPOINT is ``modelinit serve``, so the Job sets ``command``."""
CONTAINER = "modelinit-init"
PART_ENV = "MODELINIT_PART"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
"""Set on every pod of an Indexed Job by the Job controller: the value JOB_COMPLETION_INDEX holds."""
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NAMESPACE = "training"
QUEUE = "training-queue"
"""The LocalQueue of deploy/examples/kueue-queues.yaml."""
SECRET = "modelinit-store"
"""The store-credentials Secret deploy/k8s/init-job mounts (keys AWS_ACCESS_KEY_ID, ..., one file each)."""
STORE_DIR = "/var/run/modelinit-store"
"""Where the pods mount that Secret; ``MODELINIT_STORE_SECRETS`` names it (modelinit.store_secrets), so
the keys are files, never env vars' values (not beside the token's mount: a Secret volume is read-only)."""
TOKEN_SECRET = "modelinit-token"
"""The token Secret of docs/deploy.md (key ``token``), mounted as a file with ``--server``."""
TOKEN_DIR = "/var/run/modelinit"
"""Where the pods mount that Secret; ``MODELINIT_TOKEN=@{TOKEN_DIR}/token`` (the client reads
``@PATH`` as the file's content), so the token is a file, never an env var's value."""
BACKOFF_LIMIT_PER_INDEX = 3
EXIT_BAD_INPUT = 2
"""What ``modelinit init`` exits with for bad input (spec, flags): every part would fail alike."""
RUN_AS = 10001
"""The images' USER (deploy/Dockerfile*)."""
TTL_SECONDS = 86400
DEFAULT_RATE = 0.5e9
"""Bytes per second one pod writes, for ``plan --parts``: about what one client wrote in
docs/performance.md (0.5 GB/s)."""

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^(\d+(\.\d+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_DEVICES = ("cpu", "cuda", "auto")


def _bad(message: str) -> ModelInitError:
    """Bad input: the CLI prints it as one line and exits 2."""
    return ModelInitError(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check(pattern: re.Pattern, value: Any, flag: str, what: str, longest: int = 63) -> str:
    """``value`` if it is a string matching ``pattern`` of at most ``longest`` characters."""
    if not isinstance(value, str) or not pattern.match(value) or len(value) > longest:
        raise _bad(f"{flag}: {value!r} is not {what} (at most {longest} characters)")
    return value


def _label(value: Any, flag: str) -> str:
    """A DNS label (RFC 1123): what Job names, namespaces and pod hostnames must be."""
    return _check(_LABEL, value, flag, "a DNS label: lower-case letters, digits and '-', starting and ending alphanumeric")


def _subdomain(value: Any, flag: str) -> str:
    """An object name (Secret, ServiceAccount, claim): a DNS subdomain."""
    return _check(_SUBDOMAIN, value, flag, "a Kubernetes object name (lower-case letters, digits, '-', '.')", 253)


def _quantity(value: Any, flag: str) -> str:
    """A positive Kubernetes quantity (``4``, ``500m``, ``16Gi``), as a string."""
    text = str(value)
    m = _QUANTITY.match(text)
    if m is None or float(m.group(1)) == 0:
        raise _bad(f"{flag}: {text!r} is not a positive Kubernetes quantity, e.g. 4, 500m, 16Gi")
    return text


def check_parts(count: Any) -> int:
    """``count`` if it is a number of parts (1..MAX_PARTS); INVALID_ARGUMENT naming --parts."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_PARTS:
        raise _bad(f"--parts: the number of parts (pods) must be an integer in 1..{MAX_PARTS}, got {count!r}")
    return count


def parse_bytes(text: str, flag: str) -> float:
    """``5GB`` (10^9), ``500MB``, ``2GiB`` (2^30), ``4096``: sizes in the grammar of
    ``modelinit_wire.sizes`` (``--rate``, ``--memory-budget``), as a float (``0.5GB`` is allowed)."""
    parts = split_size(str(text))
    if parts is None or float(parts[0]) <= 0:
        raise _bad(f"{flag}: cannot parse {text!r}; give bytes or a number with a unit ({UNIT_NAMES})")
    return float(parts[0]) * parts[1]


def parse_rate(text: str, flag: str = "--rate") -> float:
    """Bytes per second from ``0.5GB/s``, ``500MB/s`` or ``500MB`` (per second implied)."""
    value = str(text).strip()
    value = value[:-2] if value.lower().endswith("/s") else value
    return parse_bytes(value, flag)


def _literal(value: str) -> str:
    """``value`` as a container arg the kubelet leaves alone: it expands ``$(VAR)`` and turns
    ``$$`` into ``$``, so every ``$`` is doubled."""
    return value.replace("$", "$$")


def check_out(out: Any, pvc: str | None = None) -> str | None:
    """Check ``--out`` for pods that share nothing with the caller: an object-store prefix
    (s3://, gs://, az://, ...), or an absolute path / ``file://`` URL on the ReadWriteMany claim
    ``pvc``. Returns the path to mount ``pvc`` at (None for a bucket)."""
    if not isinstance(out, str) or not out.strip():
        raise _bad("--out: give where the parts write, e.g. s3://BUCKET/PREFIX")
    scheme = url_scheme(out)
    if scheme in SCHEMES:
        if not urlsplit(out).netloc:
            raise _bad(f"--out: {out!r} names no bucket; write {scheme}://BUCKET/PREFIX")
        if pvc is not None:
            raise _bad(f"--pvc: {out} is an object-store prefix; --pvc is for an absolute path on a shared volume")
        return None
    if scheme not in (None, "file"):
        raise _bad(f"--out: {scheme}:// is not a destination; give s3://, gs://, az:// (or file:// with --pvc)")
    path = urlsplit(out).path if scheme == "file" else out
    if not path.startswith("/"):
        raise _bad(f"--out: {out!r} is a relative path on this machine; the pods do not share your disk: give "
                   "s3://BUCKET/PREFIX (or gs://, az://), or an absolute path on a shared volume with --pvc CLAIM")
    if pvc is None:
        raise _bad(f"--out: {out} is a local path in each pod; name the ReadWriteMany PersistentVolumeClaim they all "
                   "mount there with --pvc CLAIM, or write to s3://BUCKET/PREFIX")
    path = path.rstrip("/") or "/"
    if path == "/" or path == "/tmp" or path.startswith("/tmp/"):
        raise _bad(f"--out: mount the claim at a folder of its own, not {path}")
    return path


def _local_file(value: str, flag: str, what: str) -> ModelInitError:
    """A file on the caller's machine given where the pods would need it."""
    return _bad(f"{flag}: {value!r} is {what} on this machine; the pods cannot read it: use a preset name "
                "(or put the file into the image and edit the Job's args)")


def default_name(spec: str, request: dict[str, Any], parts: int) -> str:
    """``modelinit-init-<spec>-<8 hex of the request, --out and --parts>``: the same request
    gives the same name (``kubectl apply`` twice changes nothing), another one a new Job. Short
    enough that every pod's hostname, ``<name>-<index>``, is a DNS label."""
    digest = hashlib.sha256(json.dumps({"spec": spec, **request, "parts": parts}, sort_keys=True).encode()).hexdigest()[:8]
    room = 63 - len(f"-{parts - 1}") - len("modelinit-init--") - len(digest)
    slug = re.sub(r"[^a-z0-9]+", "-", spec.lower()).strip("-")[:room].strip("-")
    return "-".join(p for p in ("modelinit-init", slug, digest) if p)


def init_args(spec: str, *, parts: int, out: str, seed: int, policy: str | None = None, dtype: str | None = None,
              max_shard_size: str | None = None, architecture: str | None = None, algorithm_version: int | None = None,
              server: str | None = None, device: str | None = None) -> list[str]:
    """The container's args: ``init SPEC ... --out URL --part $(MODELINIT_PART)/N --quiet``, the
    kubelet putting the pod's completion index in place of ``$(MODELINIT_PART)``."""
    args = ["init", _literal(spec), "--seed", str(seed)]
    for flag, value in (("--policy", policy), ("--dtype", dtype), ("--max-shard-size", max_shard_size),
                        ("--architecture", architecture), ("--algorithm-version", algorithm_version),
                        ("--server", server), ("--device", None if server else device)):
        if value is not None:
            args += [flag, _literal(str(value))]
    return args + ["--out", _literal(out), "--part", f"$({PART_ENV})/{parts}", "--quiet"]


def _check_request(spec: Any, seed: Any, policy: Any, dtype: Any, max_shard_size: Any, algorithm_version: Any) -> int:
    """Check what every pod's ``init`` would refuse (so that a typo fails here, not N times);
    returns the seed (None: 0, written out so that the Job records it)."""
    if not isinstance(spec, str) or not spec.strip() or spec.startswith("-"):
        raise _bad(f"SPEC: give a preset name such as deepseek-v3, got {spec!r}")
    if spec.endswith(".json") or os.path.exists(spec):
        raise _local_file(spec, "SPEC", "a config file")
    seed = 0 if seed is None else seed
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise _bad(f"--seed: must be an integer in [0, 2^64), got {seed!r}")
    # As modelinit_wire.policy_file.looks_like_file tells a file from a preset.
    if policy is not None and (policy.endswith((".json", ".yaml", ".yml")) or "/" in policy or os.path.isfile(policy)):
        raise _local_file(policy, "--policy", "a policy file")
    if dtype is not None and dtype not in DTYPES:
        raise _bad(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if max_shard_size is not None:  # the server's own check, so a typo fails now, not in N pods
        try:
            size_in_bytes(str(max_shard_size), "--max-shard-size")
        except ValueError as e:
            raise _bad(str(e)) from None
    if algorithm_version is not None and algorithm_version not in ALGORITHM_VERSIONS:
        raise _bad(f"--algorithm-version: {algorithm_version!r} is not one of {', '.join(map(str, ALGORITHM_VERSIONS))}")
    return seed


def _engine(server: Any, device: Any, gpus: Any, image: Any) -> tuple[str, str]:
    """(device, image) for the pods: the CPU image and kernel by default, CUDA with GPUs."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise _bad(f"--gpus: GPUs per pod must be an integer >= 0, got {gpus!r}")
    if server is not None:
        if not isinstance(server, str) or not server.strip():
            raise _bad("--server: give the servers' address, e.g. dns:///modelinit.modelinit.svc.cluster.local:50051")
        if gpus:
            raise _bad("--gpus: with --server the servers generate the weights; the pods only write them")
    device = device or ("cuda" if gpus else "cpu")
    if device not in _DEVICES:
        raise _bad(f"--device: {device!r} is not one of {', '.join(_DEVICES)}")
    if device == "cuda" and not gpus and server is None:
        raise _bad("--device: cuda needs --gpus K (K >= 1): a pod sees only the GPUs it requests")
    if device == "cpu" and gpus:
        raise _bad("--gpus: --device cpu would not use the GPUs; drop --gpus or use --device cuda")
    image = image or f"{IMAGE}-{'cuda' if gpus else 'cpu'}"
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise _bad(f"--image: {image!r} is not an image reference")
    return device, image


def _container(image: str, args: list[str], resources: dict[str, Any], secret: str | None, server: str | None,
               mount: str | None) -> dict[str, Any]:
    """The one container: ``modelinit init`` as the restricted Pod Security Standard allows it."""
    env: list[dict[str, Any]] = [
        # The kubelet expands $(MODELINIT_PART) in the args only for variables declared here; the
        # annotation is where the Job controller puts the index (JOB_COMPLETION_INDEX reads it too).
        {"name": PART_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
        # numba would start one thread per node CPU; match the container's CPU limit instead.
        {"name": "NUMBA_NUM_THREADS", "valueFrom": {"resourceFieldRef": {"containerName": CONTAINER, "resource": "limits.cpu"}}},
    ]
    if server is not None:
        env.append({"name": "MODELINIT_TOKEN", "value": f"@{TOKEN_DIR}/token"})
    if secret is not None:
        env.append({"name": store_secrets.ENV, "value": STORE_DIR})
    c: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "Always",  # a re-pushed tag reaches every pod alike
        "command": ["modelinit"],  # the server images' ENTRYPOINT is `modelinit serve`
        "args": args,
        "env": env,
        # Requests = limits: Kueue admits the Job against the queue's quota by its requests.
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        # The root filesystem is read-only: numba's cache and temp files go to /tmp.
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if secret is not None:
        c["volumeMounts"].append({"name": "store", "mountPath": STORE_DIR, "readOnly": True})
    if server is not None:
        c["volumeMounts"].append({"name": "token", "mountPath": TOKEN_DIR, "readOnly": True})
    if mount is not None:
        c["volumeMounts"].append({"name": "checkpoint", "mountPath": mount})
    return c


def job_manifest(spec: str, *, parts: int, out: str, seed: int | None = None, policy: str | None = None,
                 dtype: str | None = None, max_shard_size: str | None = None, architecture: str | None = None,
                 algorithm_version: int | None = None, name: str | None = None, namespace: str = NAMESPACE,
                 queue: str | None = QUEUE, image: str | None = None, secret: str | None = None,
                 service_account: str | None = None, server: str | None = None, device: str | None = None,
                 gpus: int = 0, cpu: str = "4", memory: str = "4Gi", pvc: str | None = None) -> dict[str, Any]:
    """The Indexed Job (a dict, ``yaml.safe_dump`` ready) whose ``parts`` pods write one
    checkpoint of ``spec`` to ``out``; INVALID_ARGUMENT naming the flag for bad input.

    ``queue`` None or "": no Kueue (not suspended). ``secret``: a Secret of store settings
    (AWS_ACCESS_KEY_ID, ...) mounted as files at :data:`STORE_DIR`; ``service_account``: one bound to a cloud identity (IRSA, GKE
    Workload Identity). ``server``: the pods fetch from modelinit servers instead of generating.
    """
    check_parts(parts)
    seed = _check_request(spec, seed, policy, dtype, max_shard_size, algorithm_version)
    mount = check_out(out, pvc)
    device, image = _engine(server, device, gpus, image)
    namespace = _label(namespace, "--namespace")
    if queue:
        _check(_LABEL_VALUE, queue, "--queue", "a LocalQueue name")
    for flag, value in (("--secret", secret), ("--service-account", service_account), ("--pvc", pvc)):
        if value is not None:
            _subdomain(value, flag)
    resources: dict[str, Any] = {"cpu": _quantity(cpu, "--cpu"), "memory": _quantity(memory, "--memory")}
    if gpus:
        resources["nvidia.com/gpu"] = gpus
    request: dict[str, Any] = dict(seed=seed, policy=policy, dtype=dtype, max_shard_size=max_shard_size,
                                   architecture=architecture, algorithm_version=algorithm_version)
    name = default_name(spec, {**request, "out": out}, parts) if name is None else _label(name, "--name")
    if len(f"{name}-{parts - 1}") > 63:  # the Job controller names pod K's host <name>-<K>
        raise _bad(f"--name: {name!r} is too long for {parts} parts: the pods' hostnames {name}-<K> must fit 63 characters")

    args = init_args(spec, parts=parts, out=out, server=server, device=device, **request)
    pod: dict[str, Any] = {"restartPolicy": "Never"}  # what backoffLimitPerIndex and podFailurePolicy need
    if service_account is not None:
        pod["serviceAccountName"] = service_account
    pod.update({
        "automountServiceAccountToken": False,  # the pods never call the Kubernetes API
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(image, args, resources, secret, server, mount)],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
        # Optional: without the Secret the pods start and `modelinit init` stops at once with
        # exit 2 ("cannot read token file"), which fails the Job, instead of pods held in
        # ContainerCreating on the queue's quota. 0440: readable by the pods' group (fsGroup).
        + ([{"name": "token", "secret": {"secretName": TOKEN_SECRET, "optional": True, "defaultMode": 0o440,
                                         "items": [{"key": "token", "path": "token"}]}}] if server is not None else [])
        # Optional too: without it the folder is empty and the store's own credential chain applies
        # (workload identity), or its credential error stops the pods, not a pod held in ContainerCreating.
        + ([{"name": "store", "secret": {"secretName": secret, "optional": True, "defaultMode": 0o440}}]
           if secret is not None else [])
        + ([{"name": "checkpoint", "persistentVolumeClaim": {"claimName": pvc}}] if mount is not None else []),
    })
    # Not app.kubernetes.io/name: modelinit, which the server's Service and PDB select.
    labels = {"app.kubernetes.io/name": "modelinit-init", "app.kubernetes.io/part-of": "modelinit"}
    job_spec: dict[str, Any] = {"suspend": True} if queue else {}  # Kueue unsuspends it once admitted
    job_spec.update({
        "completionMode": "Indexed",
        "completions": parts,
        "parallelism": parts,
        # A failed pod reruns its own index only (the rerun keeps the shards it finished); the
        # other parts go on, and a failed index fails the Job once they are done.
        "backoffLimitPerIndex": BACKOFF_LIMIT_PER_INDEX,
        # One pod per index at a time: a replacement starts once the failed pod is gone.
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {"rules": [
            # Evicted, preempted or drained: not the part's fault, not counted.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            # Bad input (spec, flags): every part would fail the same way; stop at once.
            {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [EXIT_BAD_INPUT]}},
        ]},
        "ttlSecondsAfterFinished": TTL_SECONDS,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
    })
    metadata = {"name": name, "namespace": namespace, "labels": {**labels, **({QUEUE_LABEL: queue} if queue else {})}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def add_job_parser(sub) -> argparse.ArgumentParser:
    """Add ``job`` to the subparsers ``sub`` of the ``modelinit`` parser; returns its parser."""
    p = sub.add_parser("job", help="print a Kueue-admitted Kubernetes Indexed Job whose N pods write one checkpoint "
                                   "(modelinit job SPEC --parts N --out s3://... | kubectl apply -f -)")
    p.add_argument("spec", metavar="SPEC", help="preset name, e.g. deepseek-v3 (a local config file is not in the pods)")
    p.add_argument("--parts", type=int, required=True, metavar="N", help="pods, each writing 1/N of the shards' bytes")
    p.add_argument("--out", required=True, metavar="URL",
                   help="s3://BUCKET/PREFIX (also gs://, az://); or an absolute path / file:// URL on the claim --pvc")
    req = p.add_argument_group("request (as `modelinit init` takes it)")
    req.add_argument("--seed", type=int, default=None, help="seed, 0 <= seed < 2^64 (default 0)")
    req.add_argument("--policy", default=None, metavar="P", help="init policy preset (a policy file is not in the pods)")
    req.add_argument("--dtype", default=None, help=f"output dtype: {', '.join(DTYPES)} (default float32)")
    req.add_argument("--max-shard-size", default=None, metavar="SIZE", help="largest shard, e.g. 5GB (the default)")
    req.add_argument("--architecture", default=None, metavar="CLASS", help="model class overriding the spec's")
    req.add_argument("--algorithm-version", type=int, default=None, metavar="V", help="generation algorithm (default: the newest)")
    req.add_argument("--server", default=None, metavar="TARGET",
                     help="pods fetch from these modelinit servers (token: the Secret modelinit-token, mounted as a file); default: embedded")
    req.add_argument("--device", default=None, choices=_DEVICES, help="embedded engine (default cpu; cuda with --gpus)")
    k8s = p.add_argument_group("Kubernetes")
    k8s.add_argument("--name", default=None, help="Job name (default modelinit-init-<spec>-<hash of the request>)")
    k8s.add_argument("--namespace", default=NAMESPACE, help=f"namespace (default {NAMESPACE})")
    k8s.add_argument("--queue", default=QUEUE, metavar="Q", help=f"Kueue LocalQueue (default {QUEUE}; '' for no Kueue)")
    k8s.add_argument("--image", default=None, metavar="IMG", help=f"image with `modelinit init` (default {IMAGE}-cpu / -cuda)")
    k8s.add_argument("--secret", default=None, metavar="NAME", help=f"Secret of store credentials (keys AWS_ACCESS_KEY_ID, ...), mounted as files at {STORE_DIR}")
    k8s.add_argument("--service-account", default=None, metavar="SA", help="ServiceAccount bound to a cloud identity (IRSA, GKE Workload Identity)")
    k8s.add_argument("--pvc", default=None, metavar="CLAIM", help="ReadWriteMany claim mounted at --out (a path, not a bucket)")
    k8s.add_argument("--gpus", type=int, default=0, metavar="K", help="GPUs per pod (default 0)")
    k8s.add_argument("--cpu", default="4", metavar="C", help="CPUs per pod, request = limit (default 4)")
    k8s.add_argument("--memory", default="4Gi", metavar="M", help="memory per pod, request = limit (default 4Gi)")
    return p


def run_job(args: argparse.Namespace) -> int:
    """``modelinit job``: print the Job as one YAML document; ModelInitError (INVALID_ARGUMENT,
    naming the flag) for bad input, before anything is printed."""
    job = job_manifest(args.spec, parts=args.parts, out=args.out, seed=args.seed, policy=args.policy, dtype=args.dtype,
                       max_shard_size=args.max_shard_size, architecture=args.architecture,
                       algorithm_version=args.algorithm_version, name=args.name, namespace=args.namespace,
                       queue=args.queue, image=args.image, secret=args.secret, service_account=args.service_account,
                       server=args.server, device=args.device, gpus=args.gpus, cpu=args.cpu, memory=args.memory,
                       pvc=args.pvc)
    import yaml  # here: every other command starts without it (~10 ms)

    sys.stdout.write(yaml.safe_dump(job, sort_keys=False))
    return 0


# --- modelinit plan --parts N --rate R -------------------------------------------------------

def _duration(seconds: float) -> str:
    """``45s``, ``2m48s``, ``1h05m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _gb(n: float) -> str:
    """Bytes as ``84.8 GB`` (10^9)."""
    return f"{n / 1e9:,.1f} GB"


def parts_table(plan, count: int, rate_bytes_per_s: float = DEFAULT_RATE) -> list[str]:
    """What ``plan --parts N --rate R`` prints: each part's shards, bytes and time at ``rate``
    bytes/s per part (:func:`modelinit.parts.split_shards`, the split ``init --part`` writes),
    then the totals, one writer's time at the same rate, and a line for parts with no shard
    (:func:`modelinit.parts.idle_note`). ``plan``: a PlanResponse."""
    check_parts(count)
    if not rate_bytes_per_s > 0:
        raise _bad(f"--rate: must be > 0 bytes/s, got {rate_bytes_per_s!r}")
    sizes = [f.size for f in plan.files]
    split = split_shards(sizes, [bool(f.shard) for f in plan.files], count)
    loads = [sum(sizes[i] for i in p) for p in split]
    shards, shard_bytes, everything = sum(len(p) for p in split), sum(loads), sum(sizes)
    rows = [(str(k), str(len(p)), f"{b:,}", _gb(b), _duration(b / rate_bytes_per_s)) for k, (p, b) in enumerate(zip(split, loads))]
    header = ("part", "shards", "bytes", "size", f"time at {rate_bytes_per_s / 1e9:g} GB/s")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    table = ["  ".join(c.rjust(w) if i in (1, 2, 3) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in [header, *rows]]
    slowest, one = max(loads) / rate_bytes_per_s, everything / rate_bytes_per_s
    return [
        f"{plan.architecture or 'model'}: {shards} shard(s) in {count} parts (fingerprint {plan.fingerprint[:16] or '-'})",
        *table,
        f"total: {shards} shard(s), {shard_bytes:,} bytes ({_gb(shard_bytes)}); {len(sizes) - shards} small file(s), "
        f"{everything - shard_bytes:,} bytes, written once by the part that finishes last",
        f"time: {_duration(slowest)} with {count} writers (the largest part), {_duration(one)} with one writer"
        + (f" ({one / slowest:.1f}x)" if slowest else ""),
        *filter(None, [idle_note(plan, count)]),
    ]


def print_parts(plan, count: int, rate_bytes_per_s: float = DEFAULT_RATE) -> None:
    """Print :func:`parts_table`."""
    for line in parts_table(plan, count, rate_bytes_per_s):
        print(line)
