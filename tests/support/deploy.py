"""deploy/'s artefacts read as Kubernetes, the kubelet and Docker would, for the offline checks of
the deployment (tests/project/test_deploy.py) and of the Indexed Job (tests/client/test_job.py):
``kustomize`` renders a Kustomize directory with `kubectl kustomize` (skips without kubectl),
``SCHEMA_VERSIONS`` are the Kubernetes versions kubernetes-validate ships schemas for, and the
helpers find objects and containers, expand $(VAR) references and env as the kubelet does, parse
args with the real `modelinit` parser, parse Dockerfiles, and add up a pod's resource requests."""
from __future__ import annotations

import json
import pathlib
import posixpath
import re
import shlex
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from modelinit.cli import build_parser

from tests.support import REPO

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
EXAMPLES = DEPLOY / "examples"
SERVER_CONTAINER = "modelinit"


def validate_strict(obj: dict, version: str, where: str = "") -> None:
    """``obj`` against Kubernetes ``version``'s schema, unknown fields refused (kubernetes-validate);
    a failure names ``where``, the object, the field path and the schema's message."""
    try:
        used = kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        pytest.fail(f"{where}{obj['kind']}/{obj['metadata'].get('name', '')} invalid for Kubernetes {version}: {path}: "
                    f"{e.message}")
    assert used == version


def kustomize(directory: pathlib.Path) -> list[dict]:
    """The objects ``kubectl kustomize DIR`` renders (what ``kubectl apply -k DIR`` applies)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with Kustomize built in) is not on PATH")
    out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [o for o in yaml.safe_load_all(out.stdout) if o]


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:2])


def schema_versions() -> list[str]:
    """Every Kubernetes minor version >= 1.29 that the installed kubernetes-validate ships."""
    shipped = sorted({".".join(v.split(".")[:2]) for v in kubernetes_validate.utils.all_versions()}, key=_version_key)
    return [v for v in shipped if _version_key(v) >= (1, 29)]


SCHEMA_VERSIONS = schema_versions()


# --- helpers ----------------------------------------------------------------------------------

def parse_cli(argv: list[str]):
    """argparse result of the real `modelinit` parser; a test failure (not SystemExit) if it refuses."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the reason on stderr
        pytest.fail(f"`modelinit {' '.join(argv)}` is refused by modelinit.cli.build_parser() (exit {e.code})")


def server_config(args):
    """The ServerConfig `modelinit serve` would build from these args (validates ranges, TLS pairs)."""
    from modelinit_server.service.command import server_config as build

    return build(args)


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o.get("kind") == kind]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}{' ' + name if name else ''}, found {len(found)}"
    return found[0]


def container(pod_spec: dict, name: str) -> dict:
    (c,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return c


def selects(selector: dict, labels: dict) -> bool:
    """A matchLabels-only selector (what these manifests use) selects ``labels``."""
    assert set(selector) <= {"matchLabels"}, f"only matchLabels selectors are used here, got {selector}"
    return bool(selector.get("matchLabels")) and all(labels.get(k) == v for k, v in selector["matchLabels"].items())


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command/args. A reference to an unknown variable would be
    left as it is by the kubelet and reach the server literally: here it is an error."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        assert name in env, f"{value!r} refers to $({name}), which the container's env does not define"
        return env[name]

    return _VAR_REF.sub(sub, value)


def container_env(c: dict, objects: list[dict], namespace: str) -> dict[str, str]:
    """The container's env as the kubelet resolves it (ConfigMap values looked up in the rendered
    objects; Secret and resource values as placeholders)."""
    env: dict[str, str] = {}
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        ref = e["valueFrom"]
        if "configMapKeyRef" in ref:
            cm = [o for o in by_kind(objects, "ConfigMap")
                  if o["metadata"]["name"] == ref["configMapKeyRef"]["name"] and o["metadata"].get("namespace") == namespace]
            assert cm, f"env {e['name']}: ConfigMap {ref['configMapKeyRef']['name']} is not part of the manifests"
            data = cm[0].get("data") or {}
            assert ref["configMapKeyRef"]["key"] in data, f"env {e['name']}: key {ref['configMapKeyRef']['key']} not in the ConfigMap"
            value = data[ref["configMapKeyRef"]["key"]]
            assert isinstance(value, str), f"ConfigMap value for {ref['configMapKeyRef']['key']} must be a string"
            env[e["name"]] = value
        elif "secretKeyRef" in ref:
            env[e["name"]] = f"<secret {ref['secretKeyRef']['name']}/{ref['secretKeyRef']['key']}>"
        elif "resourceFieldRef" in ref:
            env[e["name"]] = f"<{ref['resourceFieldRef']['resource']}>"
        else:
            env[e["name"]] = "<fieldRef>"
    return env


def serve_args(objects: list[dict]):
    """(Deployment, server container, resolved args, parsed args, ServerConfig) of a rendering."""
    dep = one(objects, "Deployment", "modelinit")
    c = container(dep["spec"]["template"]["spec"], SERVER_CONTAINER)
    env = container_env(c, objects, dep["metadata"]["namespace"])
    args = [expand(a, env) for a in c.get("args") or []]
    parsed = parse_cli(["serve", *args])
    return dep, c, args, parsed, server_config(parsed)


def mounted_file(pod_spec: dict, c: dict, path: str) -> tuple[dict, str]:
    """(volume, key) of the Secret volume that provides file ``path`` inside container ``c``."""
    for m in c.get("volumeMounts") or []:
        mount = m["mountPath"].rstrip("/")
        if posixpath.dirname(path) == mount:
            (vol,) = [v for v in pod_spec["volumes"] if v["name"] == m["name"]]
            assert "secret" in vol, f"{path} must come from a Secret volume, got {vol}"
            fname = posixpath.basename(path)
            items = vol["secret"].get("items")
            if items:
                keys = [i["key"] for i in items if i["path"] == fname]
                assert keys, f"{path}: Secret volume {vol['name']} maps no key to {fname}"
                return vol, keys[0]
            return vol, fname
    pytest.fail(f"{path} is not in any volume mounted into container {c['name']}")


def parse_dockerfile(path: pathlib.Path) -> list[dict]:
    """Stages of a Dockerfile: {name, base, env, user, entrypoint, cmd, expose, runs, copies}."""
    instructions: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue  # comments (also inside continuations, as Docker does) and blank lines
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        instructions.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    stages: list[dict] = []
    for word, rest in instructions:
        if word == "FROM":
            parts = rest.split()
            assert not parts[0].startswith("--"), f"{path}: FROM flags are not expected: {rest}"
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append({"name": name, "base": parts[0], "env": {}, "user": None, "entrypoint": None, "cmd": None,
                           "expose": [], "runs": [], "copies": []})
            continue
        assert stages, f"{path}: {word} before FROM"
        st = stages[-1]
        if word == "ENV":
            tokens = shlex.split(rest)
            if tokens and "=" not in tokens[0]:  # legacy `ENV KEY value`
                st["env"][tokens[0]] = " ".join(tokens[1:])
            else:
                for t in tokens:
                    k, _, v = t.partition("=")
                    st["env"][k] = v
        elif word == "USER":
            st["user"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                pytest.fail(f"{path}: {word} must use the exec (JSON) form so that signals reach the server: {rest}")
            st[word.lower()] = value
        elif word == "EXPOSE":
            st["expose"] += [int(p.split("/")[0]) for p in rest.split()]
        elif word == "RUN":
            st["runs"].append(rest)
        elif word in ("COPY", "ADD"):
            st["copies"].append((word, rest))
    return stages


def resolve_base(stages: list[dict], base: str) -> str:
    """The image a stage ultimately builds on (following FROM <earlier stage>)."""
    names = {s["name"]: s for s in stages if s["name"]}
    while base in names:
        base = names[base]["base"]
    return base


def load_examples() -> list[dict]:
    objects = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return objects


_QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_UNITS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(q) -> float:
    m = _QUANTITY.match(str(q))
    assert m, f"unsupported quantity {q!r}"
    return float(m.group(1)) * _UNITS[m.group(2)]


def pod_requests(pod: dict) -> dict[str, float]:
    """What Kueue (and the scheduler) count for a pod: max(any init container, sum of containers)."""
    def req(c):
        r = dict((c.get("resources") or {}).get("limits") or {})
        r.update((c.get("resources") or {}).get("requests") or {})
        return {k: quantity(v) for k, v in r.items()}

    total: dict[str, float] = {}
    for c in pod["containers"]:
        for k, v in req(c).items():
            total[k] = total.get(k, 0) + v
    for c in pod.get("initContainers") or []:
        for k, v in req(c).items():
            total[k] = max(total.get(k, 0), v)
    return total
