"""deploy/'s manifests through an independent scanner: checkov's kubernetes checks (pinned in
tests/support/scanner.py, installed into a venv of its own on first use) over what
`kubectl apply` would get: every Kustomize directory rendered with `kubectl kustomize`, and the
plain files of deploy/examples.

A finding fails the test unless :data:`DELIBERATE` lists it with its reason; docs/deploy.md
("Security scan") gives the same list, and an entry the scan no longer reports fails too, so
neither can drift. Two scans (the manifests, and a copy with two findings put back), about 6 s
each on 2 cores; the first run installs checkov (about a minute and a half).
"""
from __future__ import annotations

import pathlib
import re
import shutil
from typing import NamedTuple

import pytest
import yaml

from modelinit.job import job_manifest

from tests.support import REPO
from tests.support.deploy import DEPLOY, EXAMPLES, kustomize
from tests.support.scanner import CHECKOV, scan

pytestmark = pytest.mark.slow  # checkov: installed on first use (about a minute), then a scan per case

#: The Kustomize directories scanned, rendered (deploy/k8s/base too: the scanner judges it alone).
RENDERED = ("k8s/base", "k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-tls", "k8s/init-job", "k8s/jobset",
            "k8s/kubeflow-trainer", "monitoring")
#: The Job `modelinit job` prints, scanned as a source of its own.
PRINTED_JOB = "modelinit job --server"
SERVER_OVERLAYS = ("k8s/base", "k8s/overlays/cpu", "k8s/overlays/gpu", "k8s/overlays/gpu-tls")


class Deliberate(NamedTuple):
    check: str
    """checkov's check id."""
    resource: str
    """The object as checkov names it (Kind.namespace.name)."""
    sources: tuple[str, ...]
    """Where under deploy/ it comes from (a Kustomize directory or an example file)."""
    reason: str


RELEASE_DIGEST = ("digests are pinned at release, in the `images:` entry (`digest: sha256:...`), when the image exists; "
                  "the repository's images are placeholders of the user's registry")

DELIBERATE = (
    Deliberate("CKV_K8S_43", "Deployment.modelinit.modelinit", SERVER_OVERLAYS, RELEASE_DIGEST),
    Deliberate("CKV_K8S_43", "Job.training.modelinit-init-deepseek-v3", ("k8s/init-job",), RELEASE_DIGEST),
    Deliberate("CKV_K8S_43", "Job.training.llama-3-8b-pretrain", ("examples/training-job.yaml",),
               "placeholder images (the user's client build and trainer): pinned by whoever fills them in"),
    Deliberate("CKV_K8S_43", "Job.training.modelinit-init-deepseek-v3-b3936b4a", (PRINTED_JOB,),
               "the image is --image's (default: the release tag): pass a digest reference to pin it"),
)


class Finding(NamedTuple):
    check: str
    resource: str
    source: str


def _file_name(source: str) -> str:
    return source.replace("/", "__").removesuffix(".yaml") + ".yaml"


def render(into: pathlib.Path) -> dict[str, str]:
    """Every scanned manifest written into ``into``, one file per source; file name -> source."""
    names = {}
    for source in RENDERED:
        (into / _file_name(source)).write_text(yaml.safe_dump_all(kustomize(DEPLOY / source)))
        names[_file_name(source)] = source
    for path in sorted(EXAMPLES.glob("*.yaml")):
        source = f"examples/{path.name}"
        shutil.copyfile(path, into / _file_name(source))
        names[_file_name(source)] = source
    # What `modelinit job --server ... --secret ...` prints (its pods meet init-job's NetworkPolicy).
    (into / _file_name(PRINTED_JOB)).write_text(yaml.safe_dump(job_manifest(
        "deepseek-v3", parts=4, out="s3://checkpoints/deepseek-v3", seed=42, secret="modelinit-store",
        server="dns:///modelinit.modelinit.svc.cluster.local:50051")))
    names[_file_name(PRINTED_JOB)] = PRINTED_JOB
    return names


def findings(directory: pathlib.Path, names: dict[str, str]) -> set[Finding]:
    return {Finding(f["check_id"], f["resource"], names[f["file"]]) for f in scan(directory)}


def allowed() -> set[Finding]:
    return {Finding(d.check, d.resource, s) for d in DELIBERATE for s in d.sources}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    where = tmp_path_factory.mktemp("rendered")
    return where, render(where)


@pytest.fixture(scope="module")
def found(rendered):
    return findings(*rendered)


def test_no_finding_but_the_deliberate_ones(found):
    unexpected = sorted(found - allowed())
    assert not unexpected, (f"{CHECKOV} reports (fix the manifest, or list it in DELIBERATE and docs/deploy.md "
                            f"with the reason): {unexpected}")


def test_every_deliberate_entry_is_still_reported(found):
    stale = sorted(allowed() - found)
    assert not stale, f"no longer reported: remove from DELIBERATE and docs/deploy.md: {stale}"


def test_docs_list_the_same_exceptions():
    """docs/deploy.md's table of findings left as they are: one row per DELIBERATE entry."""
    text = (REPO / "docs" / "deploy.md").read_text()
    section = re.search(r"^### Findings left as they are\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert section, "docs/deploy.md has no '### Findings left as they are' section"
    rows = set()
    for line in section.group(1).splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"CKV2?_K8S_\d+", cells[0]):
            rows.add((cells[0], cells[1], tuple(s.strip().strip("`") for s in cells[2].split(","))))
    assert rows == {(d.check, d.resource, d.sources) for d in DELIBERATE}
    scanner = re.search(r"^## Security scan\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert scanner and f"checkov](https://www.checkov.io/) {CHECKOV.split('==')[1]}" in scanner.group(1), \
        "docs/deploy.md names the checkov release the test pins"


def _put_back(path: pathlib.Path, change) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    path.write_text(yaml.safe_dump_all([d for d in map(change, docs) if d is not None]))


def test_scan_catches_a_finding_put_back(rendered, found, tmp_path):
    """Two of the findings fixed here, put back into a copy of the rendered manifests: the init
    Job's pods without their NetworkPolicy, and the example's token as an env var from its Secret.
    The scan reports both, and nothing else new."""
    where, names = rendered
    copy = tmp_path / "rendered"
    shutil.copytree(where, copy)

    def no_network_policy(obj):
        return None if obj["kind"] == "NetworkPolicy" else obj

    def token_from_env(obj):
        if obj["kind"] == "Job":
            (init,) = obj["spec"]["template"]["spec"]["initContainers"]
            (tok,) = [e for e in init["env"] if e["name"] == "MODELINIT_TOKEN"]
            tok.pop("value")
            tok["valueFrom"] = {"secretKeyRef": {"name": "modelinit-token", "key": "token"}}
        return obj

    _put_back(copy / _file_name("k8s/init-job"), no_network_policy)
    _put_back(copy / _file_name("examples/training-job.yaml"), token_from_env)
    new = findings(copy, names) - found
    assert {(f.check, f.source) for f in new} == {("CKV2_K8S_6", "k8s/init-job"), ("CKV2_K8S_6", PRINTED_JOB),
                                                  ("CKV_K8S_35", "examples/training-job.yaml")}, new
