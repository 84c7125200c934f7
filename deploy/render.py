#!/usr/bin/env python3
"""Render a kustomization under deploy/k8s without the kustomize binary.

    python deploy/render.py deploy/k8s/overlays/gpu > modelinit.yaml     # what `kubectl kustomize` prints
    python deploy/render.py deploy/k8s/overlays/gpu | kubectl apply -f -  # same objects as `kubectl apply -k`

Why it exists: no Kustomize renderer can be installed from PyPI (the `kustomize` package there is
an unrelated Python library), and CI installs only what pip gives it, so the tests in
tests/test_deploy.py render the overlays with this module. Where `kubectl` or `kustomize` is on
PATH the tests also render with it and require the very same objects.

It implements exactly the Kustomize features deploy/k8s uses, and refuses every other field of a
kustomization.yaml (KustomizeFeatureError) instead of silently ignoring it:

- ``apiVersion: kustomize.config.k8s.io/v1beta1``, ``kind: Kustomization``;
- ``resources``: YAML files (one or more documents each) and directories holding a
  ``kustomization.yaml`` (rendered recursively; that is how an overlay builds on the base);
  two resources with the same kind, namespace and name are an error, as in kustomize;
- ``patches``: each entry has ``path`` (relative to the kustomization) or an inline ``patch``,
  and optionally a ``target`` (``group``, ``version``, ``kind``, ``name``, ``namespace``; no
  label/annotation selectors, no regular expressions):
    * a patch that is a YAML list is a JSON 6902 patch (RFC 6902 ``add``, ``remove``,
      ``replace``, ``test``; ``copy``/``move`` are refused) and needs a ``target``;
    * otherwise it is a strategic-merge patch: a partial object whose ``apiVersion``, ``kind``
      and ``metadata.name`` (and ``metadata.namespace``, when given) pick the resource, or the
      ``target`` when there is one. Maps merge key by key; a ``null`` value deletes the key;
      the lists Kubernetes merges by a key are merged by that key (``containers``,
      ``initContainers``, ``ephemeralContainers``, ``env``, ``volumes``, ``imagePullSecrets``:
      ``name``; ``volumeMounts``: ``mountPath``; ``volumeDevices``: ``devicePath``;
      container ``ports``: ``containerPort``; Service ``ports``: ``port``), giving the patch's
      elements first, then the original ones it does not name (kustomize's order); every other list
      (``args``, ``command``, ``tolerations``, ...) is replaced whole, as Kubernetes does for
      lists without a patch merge key. ``$patch``/``$setElementOrder`` directives are refused;
- ``images``: ``name`` with ``newName``, ``newTag`` and/or ``digest``; rewrites the ``image``
  of every ``containers``/``initContainers`` entry whose image name (without tag or digest)
  equals ``name``.

Not supported (use real kustomize for these): ``namespace``, ``namePrefix``/``nameSuffix``,
``labels``/``commonLabels``/``commonAnnotations``, generators, ``replicas``, ``components``,
``replacements``/``vars``, ``helmCharts``, remote resources.
"""
from __future__ import annotations

import copy
import pathlib
import sys
from typing import Any

import yaml

__all__ = ["KustomizeFeatureError", "render", "render_yaml", "strategic_merge", "json_patch", "set_image"]

KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "patches", "images"}

#: Lists that Kubernetes' strategic merge patch merges element by element, and their merge key.
#: (``ports`` is resolved by context: ``containerPort`` in containers, ``port`` in a Service.)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}


class KustomizeFeatureError(ValueError):
    """A kustomization uses something this renderer does not implement, or is inconsistent."""


def _load_docs(path: pathlib.Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [d for d in yaml.safe_load_all(fh) if d is not None]


def _kustomization_file(directory: pathlib.Path) -> pathlib.Path:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            return directory / name
    raise KustomizeFeatureError(f"{directory}: no kustomization.yaml")


def _resource_id(obj: dict) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def render(directory: str | pathlib.Path) -> list[dict]:
    """The objects the kustomization in ``directory`` produces, in resource order."""
    directory = pathlib.Path(directory)
    kfile = _kustomization_file(directory)
    (k,) = _load_docs(kfile)
    unknown = set(k) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeFeatureError(f"{kfile}: unsupported kustomization fields {sorted(unknown)} (see deploy/render.py)")
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        raise KustomizeFeatureError(f"{kfile}: expected apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization")

    objects: list[dict] = []
    for entry in k.get("resources") or []:
        path = directory / entry
        if "://" in entry or entry.startswith(("github.com/", "git@")):
            raise KustomizeFeatureError(f"{kfile}: remote resource {entry!r} is not supported")
        if path.is_dir():
            objects.extend(render(path))
        elif path.is_file():
            objects.extend(_load_docs(path))
        else:
            raise KustomizeFeatureError(f"{kfile}: resource {entry!r} does not exist")
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        rid = _resource_id(obj)
        if rid in seen:
            raise KustomizeFeatureError(f"{kfile}: resource {rid} appears twice")
        seen.add(rid)

    for i, entry in enumerate(k.get("patches") or []):
        _apply_patch(objects, entry, directory, f"{kfile}: patches[{i}]")
    for i, entry in enumerate(k.get("images") or []):
        extra = set(entry) - {"name", "newName", "newTag", "digest"}
        if extra or "name" not in entry:
            raise KustomizeFeatureError(f"{kfile}: images[{i}]: needs name, supports newName/newTag/digest only")
        for obj in objects:
            set_image(obj, entry["name"], new_name=entry.get("newName"), new_tag=entry.get("newTag"), digest=entry.get("digest"))
    return objects


def render_yaml(directory: str | pathlib.Path) -> str:
    """``render`` as a multi-document YAML stream."""
    return yaml.safe_dump_all(render(directory), sort_keys=False, default_flow_style=False)


# --- patches -----------------------------------------------------------------------------------

def _apply_patch(objects: list[dict], entry: dict, directory: pathlib.Path, where: str) -> None:
    extra = set(entry) - {"path", "patch", "target"}
    if extra or ("path" in entry) == ("patch" in entry):
        raise KustomizeFeatureError(f"{where}: needs exactly one of path/patch (and optionally target); got {sorted(entry)}")
    if "path" in entry:
        docs = _load_docs(directory / entry["path"])
    else:
        docs = [d for d in yaml.safe_load_all(entry["patch"]) if d is not None]
    if len(docs) != 1:
        raise KustomizeFeatureError(f"{where}: a patch must be exactly one YAML document")
    (patch,) = docs
    target = entry.get("target")
    if target is not None:
        bad = set(target) - {"group", "version", "kind", "name", "namespace"}
        if bad:
            raise KustomizeFeatureError(f"{where}: target selectors {sorted(bad)} are not supported")
    if isinstance(patch, list):
        if target is None:
            raise KustomizeFeatureError(f"{where}: a JSON 6902 patch needs a target")
        matches = [i for i, o in enumerate(objects) if _matches_target(o, target)]
        if not matches:
            raise KustomizeFeatureError(f"{where}: target {target} matches no resource")
        for i in matches:
            objects[i] = json_patch(objects[i], patch)
        return
    if not isinstance(patch, dict):
        raise KustomizeFeatureError(f"{where}: a patch must be a map (strategic merge) or a list (JSON 6902)")
    _refuse_directives(patch, where)
    if target is not None:
        matches = [i for i, o in enumerate(objects) if _matches_target(o, target)]
    else:
        meta = patch.get("metadata") or {}
        if not (patch.get("kind") and meta.get("name")):
            raise KustomizeFeatureError(f"{where}: a strategic-merge patch without target needs kind and metadata.name")
        matches = [
            i for i, o in enumerate(objects)
            if o.get("kind") == patch["kind"]
            and (o.get("metadata") or {}).get("name") == meta["name"]
            and (not patch.get("apiVersion") or o.get("apiVersion") == patch["apiVersion"])
            and ("namespace" not in meta or (o.get("metadata") or {}).get("namespace") == meta["namespace"])
        ]
        if len(matches) > 1:
            raise KustomizeFeatureError(f"{where}: patch for {patch['kind']}/{meta['name']} matches several resources; add a namespace")
    if not matches:
        raise KustomizeFeatureError(f"{where}: patch matches no resource")
    for i in matches:
        objects[i] = strategic_merge(objects[i], patch)


def _refuse_directives(value: Any, where: str) -> None:
    """Strategic-merge directives ($patch, $setElementOrder/..., $retainKeys, ...) anywhere."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and k.startswith("$"):
                raise KustomizeFeatureError(f"{where}: strategic-merge directive {k!r} is not supported")
            _refuse_directives(v, where)
    elif isinstance(value, list):
        for v in value:
            _refuse_directives(v, where)


def _matches_target(obj: dict, target: dict) -> bool:
    api = obj.get("apiVersion", "")
    group, _, version = api.rpartition("/")
    meta = obj.get("metadata") or {}
    checks = {
        "group": group,
        "version": version,
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
    }
    return all(checks[k] == v for k, v in target.items())


def strategic_merge(original: Any, patch: Any, field: str = "", kind: str = "") -> Any:
    """Kubernetes strategic merge of ``patch`` into ``original`` (a new object; see the module
    docstring for the subset implemented). ``field`` is the name of the field being merged,
    ``kind`` the top-level object's kind (both pick list merge keys)."""
    if isinstance(patch, dict):
        for key in patch:
            if isinstance(key, str) and key.startswith("$"):
                raise KustomizeFeatureError(f"strategic-merge directive {key!r} is not supported")
        if not isinstance(original, dict):
            return _drop_nulls(copy.deepcopy(patch))
        if not field:
            kind = patch.get("kind") or original.get("kind") or kind
        out = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = strategic_merge(out[key], value, key, kind)
            else:
                out[key] = _drop_nulls(copy.deepcopy(value))
        return out
    if isinstance(patch, list):
        key = _merge_key(field, kind)
        if key is None or not isinstance(original, list):
            return _drop_nulls(copy.deepcopy(patch))
        # As kustomize orders them: the patch's elements first (merged into the original element
        # with the same key, if any), then the original elements the patch did not name.
        out, used = [], set()
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise KustomizeFeatureError(f"strategic merge of {field!r}: every element needs its merge key {key!r}")
            for j, existing in enumerate(original):
                if j not in used and isinstance(existing, dict) and existing.get(key) == item[key]:
                    used.add(j)
                    out.append(strategic_merge(existing, item, "[]", kind))
                    break
            else:
                out.append(_drop_nulls(copy.deepcopy(item)))
        out.extend(copy.deepcopy(e) for j, e in enumerate(original) if j not in used)
        return out
    return copy.deepcopy(patch)


def _merge_key(field: str, kind: str) -> str | None:
    if field in MERGE_KEYS:
        return MERGE_KEYS[field]
    if field == "ports":
        return "port" if kind == "Service" else "containerPort"
    return None


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise KustomizeFeatureError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for p in parts:
        if isinstance(doc, dict) and p in doc:
            doc = doc[p]
        elif isinstance(doc, list) and p.isdigit() and int(p) < len(doc):
            doc = doc[int(p)]
        else:
            raise KustomizeFeatureError(f"JSON patch path {path!r} does not exist")
    return doc


def json_patch(document: dict, operations: list[dict]) -> dict:
    """RFC 6902 ``add``/``remove``/``replace``/``test`` applied to a copy of ``document``."""
    doc = copy.deepcopy(document)
    for op in operations:
        kind, path = op.get("op"), op.get("path", "")
        parts = _pointer(path)
        if not parts:
            raise KustomizeFeatureError("JSON patch on the whole document is not supported")
        parent, last = _walk(doc, parts[:-1], path), parts[-1]
        if kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise KustomizeFeatureError(f"JSON patch test failed at {path!r}")
        elif kind == "add":
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                if last == "-":
                    parent.append(value)
                elif last.isdigit() and int(last) <= len(parent):
                    parent.insert(int(last), value)
                else:
                    raise KustomizeFeatureError(f"JSON patch add: bad list index in {path!r}")
            elif isinstance(parent, dict):
                parent[last] = value
            else:
                raise KustomizeFeatureError(f"JSON patch add: {path!r} is inside a scalar")
        elif kind in ("remove", "replace"):
            _walk(parent, [last], path)  # must exist
            if kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        else:
            raise KustomizeFeatureError(f"JSON patch op {kind!r} is not supported (add, remove, replace, test)")
    return doc


# --- images ------------------------------------------------------------------------------------

def split_image(image: str) -> tuple[str, str | None, str | None]:
    """``registry:5000/repo/name:tag@sha256:...`` -> (name, tag, digest)."""
    name, digest = image.split("@", 1) if "@" in image else (image, None)
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
    return name, tag, digest


def set_image(obj: Any, name: str, new_name: str | None = None, new_tag: str | None = None, digest: str | None = None) -> None:
    """Kustomize's ``images`` transformer, in place, on every container and init container."""
    if isinstance(obj, dict):
        for field in ("containers", "initContainers"):
            containers = obj.get(field)
            for c in containers if isinstance(containers, list) else []:
                if isinstance(c, dict) and isinstance(c.get("image"), str):
                    cname, ctag, cdigest = split_image(c["image"])
                    if cname != name:
                        continue
                    cname = new_name or cname
                    if digest:
                        ctag, cdigest = new_tag, digest
                    elif new_tag:
                        ctag, cdigest = new_tag, None
                    c["image"] = cname + (f":{ctag}" if ctag else "") + (f"@{cdigest}" if cdigest else "")
        for v in obj.values():
            set_image(v, name, new_name, new_tag, digest)
    elif isinstance(obj, list):
        for v in obj:
            set_image(v, name, new_name, new_tag, digest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: python deploy/render.py DIR   (a directory holding a kustomization.yaml)", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(render_yaml(argv[0]))
    except KustomizeFeatureError as e:
        print(f"render: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
