"""Offline checks of the deployment artefacts in deploy/ (no Docker engine, no cluster needed).

- Kubernetes manifests: the overlays under deploy/k8s/overlays rendered by `kubectl kustomize`
  (Kustomize built into kubectl, installed on the project's machines and CI's), and
  the examples under deploy/examples, validated with kubernetes-validate in strict mode against
  every Kubernetes version >= 1.29 whose schemas the installed package ships. Kueue objects
  (CRDs: no schema there) are checked for the structure Kueue needs.
- Consistency with the real server: the Deployment's args (with the ConfigMap's values
  expanded as the kubelet does) and the Dockerfiles' CMD parse with `modelinit.cli.build_parser()`
  and make a valid ServerConfig; probes, Service, NetworkPolicy and metrics annotations use
  those ports; the readiness probe names the proto's service; the termination grace period
  covers --grace + --shutdown-delay; the Job's init container command parses as `init`.
- Dockerfiles, parsed: ENTRYPOINT, non-root numeric USER, base images pinned by tag, torch
  pinned to the version CI tests, writable caches under /tmp.
"""
from __future__ import annotations

import fnmatch
import re

import kubernetes_validate
import pytest
from modelinit_wire.v1 import modelinit_pb2

from tests.support import REPO
from tests.support.deploy import (
    validate_strict,
    DEPLOY,
    K8S,
    SCHEMA_VERSIONS,
    SERVER_CONTAINER,
    container,
    kustomize,
    load_examples,
    mounted_file,
    one,
    parse_cli,
    parse_dockerfile,
    pod_requests,
    quantity,
    resolve_base,
    selects,
    serve_args,
    server_config,
)

OVERLAYS = ("cpu", "gpu", "gpu-tls")
SERVICE_NAME = modelinit_pb2.DESCRIPTOR.services_by_name["ModelInit"].full_name
KUEUE_API = "kueue.x-k8s.io/v1beta1"


# --- Dockerfiles ------------------------------------------------------------------------------

_PINNED = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/-]*(?::[0-9]+/[a-z0-9._/-]+)?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                     r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")

DOCKERFILES = {
    # file: (ENTRYPOINT, server device in CMD or None, pip extras installed: the engine's, and
    # `cloud` so the image's `modelinit init --out s3://...` (the Indexed Job's pods) can write)
    "Dockerfile": (["modelinit", "serve"], "cpu", "server,cloud"),
    "Dockerfile.cuda": (["modelinit", "serve"], "cuda", "cuda,cloud"),
    "Dockerfile.client": (["modelinit"], None, None),
}


def readme_torch_pin() -> str:
    block = re.search(r"<!-- ci:test -->(.*?)<!-- /ci:test -->", (REPO / "README.md").read_text(), re.S)
    assert block, "README.md has no ci:test block"
    m = re.search(r"torch==([0-9][0-9a-z.+]*)", block.group(1))
    assert m, "the README's CI test command pins no torch version"
    return m.group(1)


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_dockerfile_is_checked():
    found = {p.name for p in DEPLOY.glob("Dockerfile*") if not p.name.endswith(".dockerignore")}
    assert found == set(DOCKERFILES)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfile_conventions(name):
    entrypoint, device, extra = DOCKERFILES[name]
    path = DEPLOY / name
    stages = parse_dockerfile(path)
    final = stages[-1]

    # Every base image is an earlier stage or pinned by tag (or digest), never `latest`.
    names = set()
    for st in stages:
        if st["base"] not in names:
            m = _PINNED.match(st["base"])
            assert m, f"{name}: unparseable base image {st['base']!r}"
            assert m["tag"] or m["digest"], f"{name}: base image {st['base']!r} is not pinned by tag or digest"
            assert m["tag"] != "latest", f"{name}: base image {st['base']!r} uses the moving `latest` tag"
            assert "$" not in st["base"]
        if st["name"]:
            names.add(st["name"])

    # The venv is copied from a stage on the same base image (its interpreter path must exist).
    for st in stages:
        for word, rest in st["copies"]:
            m = re.search(r"--from=(\S+)", rest)
            if m:
                assert resolve_base(stages, m.group(1)) == resolve_base(stages, st["base"]), \
                    f"{name}: COPY --from={m.group(1)} comes from another base image than its stage"

    # Non-root numeric user (and group), set in the final stage.
    assert final["user"], f"{name}: the final stage sets no USER"
    uid, _, gid = final["user"].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"{name}: USER must be a non-root numeric UID, got {final['user']!r}"
    assert not gid or (gid.isdigit() and int(gid) != 0), f"{name}: USER group must be numeric and not root"

    assert final["entrypoint"] == entrypoint, f"{name}: ENTRYPOINT {final['entrypoint']}"
    scripts = pyproject()["project"]["scripts"]
    assert scripts.get("modelinit") == "modelinit.cli:run", "the `modelinit` console script the ENTRYPOINT runs"

    # COPY sources exist in the build context and the Dockerfile's .dockerignore keeps them.
    ignore = (DEPLOY / f"{name}.dockerignore")
    assert ignore.is_file(), f"{name}: no {name}.dockerignore next to it (the whole repo would be the build context)"
    patterns = [p.strip() for p in ignore.read_text().splitlines() if p.strip() and not p.strip().startswith("#")]
    for word, rest in (c for st in stages for c in st["copies"]):
        assert word == "COPY", f"{name}: use COPY, not ADD ({rest})"
        if "--from=" in rest:
            continue
        for src in rest.split()[:-1]:
            assert (REPO / src).exists(), f"{name}: COPY source {src} does not exist"
            included = True
            for pat in patterns:
                neg = pat.startswith("!")
                if fnmatch.fnmatch(src.rstrip("/"), pat.lstrip("!").rstrip("/")):
                    included = neg
            assert included, f"{name}: {src} is excluded by {ignore.name}"

    runs = " ".join(r for st in stages for r in st["runs"])
    env = final["env"]
    assert env.get("HOME", "").startswith("/tmp"), f"{name}: HOME must be writable with a read-only root (under /tmp)"
    if device is None:
        return

    # The server images: caches under /tmp, the torch CI tests with, the right extra, the CMD.
    assert env.get("NUMBA_CACHE_DIR", "").startswith("/tmp/"), f"{name}: NUMBA_CACHE_DIR must be under /tmp"
    if device == "cuda":
        assert env.get("TRITON_CACHE_DIR", "").startswith("/tmp/"), f"{name}: TRITON_CACHE_DIR must be under /tmp"
        assert re.search(r"\bgcc\b", runs) and "python3-dev" in runs, \
            f"{name}: Triton compiles its launcher at run time: gcc and Python headers are needed"
    torch = readme_torch_pin()
    torch_runs = [r for r in (r for st in stages for r in st["runs"]) if re.search(r"\btorch==", r)]
    assert torch_runs, f"{name}: torch is not pinned"
    for r in torch_runs:
        assert f"torch=={torch}" in r, f"{name}: torch must be pinned to the README's CI version {torch}: {r}"
    if device == "cpu":
        assert any("--index-url https://download.pytorch.org/whl/cpu" in r for r in torch_runs), \
            f"{name}: the CPU image must take torch from the PyTorch CPU index"
    assert re.search(rf'/src\[{extra}\]', runs), f"{name}: the image must install the `{extra}` extras"
    assert all(e in pyproject()["project"]["optional-dependencies"] for e in extra.split(","))

    cmd = final["cmd"]
    assert isinstance(cmd, list)
    cfg = server_config(parse_cli(["serve", *cmd]))
    assert cfg.device == device
    assert cfg.port == 50051 and cfg.metrics_port == 9090
    assert {cfg.port, cfg.metrics_port} <= set(final["expose"]), f"{name}: EXPOSE {final['expose']}"


def test_dockerfile_user_matches_pod_security_context():
    uids = {parse_dockerfile(DEPLOY / n)[-1]["user"].split(":")[0] for n in DOCKERFILES}
    assert len(uids) == 1
    (uid,) = uids
    objects = kustomize(K8S / "overlays" / "gpu")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert str(pod["securityContext"]["runAsUser"]) == uid
    job = one(load_examples(), "Job")["spec"]["template"]["spec"]
    assert str(job["securityContext"]["runAsUser"]) == uid


# --- Kubernetes manifests ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {o: kustomize(K8S / "overlays" / o) for o in OVERLAYS}


def test_schema_versions_available():
    assert SCHEMA_VERSIONS, "kubernetes-validate ships no schema for Kubernetes >= 1.29"


def test_every_overlay_is_checked():
    assert {p.name for p in (K8S / "overlays").iterdir() if p.is_dir()} == set(OVERLAYS)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_against_kubernetes_schema(overlay, version, rendered):
    objects = rendered[overlay]
    assert {o["kind"] for o in objects} == {"Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service",
                                            "PodDisruptionBudget", "NetworkPolicy"}
    for obj in objects:
        validate_strict(obj, version, f"{overlay}: ")


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_examples_validate_against_kubernetes_schema(version):
    # CRDs have no schema there: Kueue's are checked below, the TrainJob in test_deploy_trainer.py.
    core = [o for o in load_examples() if not o["apiVersion"].startswith(("kueue.x-k8s.io/", "trainer.kubeflow.org/"))]
    assert {o["kind"] for o in core} == {"Namespace", "Job"}
    for obj in core:
        validate_strict(obj, version)


def test_validation_is_strict():
    """The validator really refuses unknown fields (so a typo in a manifest cannot pass)."""
    dep = one(kustomize(K8S / "overlays" / "cpu"), "Deployment")
    container(dep["spec"]["template"]["spec"], SERVER_CONTAINER)["readinessProbe"]["grpc"]["servce"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, SCHEMA_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_matches_the_server(overlay, rendered):
    objects = rendered[overlay]
    dep, c, args, parsed, cfg = serve_args(objects)
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(dep["spec"]["selector"], labels)
    assert "command" not in c, "the image's ENTRYPOINT (`modelinit serve`) must run; set args only"

    # Every ConfigMap key is a `serve` flag passed as --KEY=$(VAR) with VAR read from that key.
    cm = one(objects, "ConfigMap", "modelinit-serve")
    refs = {e["valueFrom"]["configMapKeyRef"]["key"]: e["name"] for e in c["env"]
            if "configMapKeyRef" in (e.get("valueFrom") or {})}
    assert set(refs) == set(cm["data"]), "every ConfigMap key is read into the container, and only those"
    for key, var in refs.items():
        assert f"--{key}=$({var})" in c["args"], f"ConfigMap key {key} is not passed as --{key}=$({var})"

    # Lifecycle: the pod is killed only after the drain (shutdown delay + grace) can finish.
    assert pod["terminationGracePeriodSeconds"] > cfg.grace + cfg.shutdown_delay
    assert cfg.shutdown_delay > 0, "a shutdown delay lets endpoints drop the pod before calls are refused"
    assert cfg.metrics_port is not None and cfg.port != cfg.metrics_port
    from modelinit_server.service.server import metrics_interface

    assert metrics_interface(cfg) in ("::", "0.0.0.0"), "Prometheus scrapes the pod IP: metrics must listen on every interface"

    # Container ports and probes.
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": cfg.port, "metrics": cfg.metrics_port}
    tls = cfg.tls_cert is not None
    for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = c[probe_name]
        if tls:
            # Kubelet's gRPC probe speaks plaintext only: it would fail against a TLS port.
            assert "grpc" not in probe and probe["tcpSocket"]["port"] == cfg.port, f"{probe_name} with TLS"
        else:
            assert probe["grpc"]["port"] == cfg.port, f"{probe_name} must be a gRPC health probe on --port"
    if not tls:
        assert c["readinessProbe"]["grpc"].get("service") == SERVICE_NAME
        assert c["livenessProbe"]["grpc"].get("service", "") == "", "liveness checks the server as a whole"
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(cfg.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"

    # The token and TLS files come from mounted Secrets.
    assert parsed.token and parsed.token.startswith("@"), "the server must require a token (--token=@FILE)"
    vol, key = mounted_file(pod, c, parsed.token[1:])
    assert vol["secret"]["secretName"] == "modelinit-token" and key == "token"
    if tls:
        for path, k in ((cfg.tls_cert, "tls.crt"), (cfg.tls_key, "tls.key")):
            vol, key = mounted_file(pod, c, path)
            assert key == k, f"{path}: a kubernetes.io/tls Secret holds {k}"

    # numba's thread count follows this container's CPU limit.
    numba = [e for e in c["env"] if e["name"] == "NUMBA_NUM_THREADS"]
    assert numba and numba[0]["valueFrom"]["resourceFieldRef"] == {"containerName": SERVER_CONTAINER, "resource": "limits.cpu"}
    assert "cpu" in c["resources"]["limits"]

    # Variant-specific resources and placement.
    gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
    if overlay.startswith("gpu"):
        assert cfg.device == "cuda" and gpus == 1
        assert pod.get("tolerations") and pod.get("nodeSelector")
        assert dep["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0, "GPU rollouts must not need a spare GPU"
    else:
        assert cfg.device == "cpu" and gpus is None
    image = c["image"]
    m = _PINNED.match(image)
    assert m and m["tag"] and m["tag"] != "latest", f"{overlay}: image {image!r} must carry a version tag"
    assert m["tag"].endswith("-cuda" if overlay.startswith("gpu") else "-cpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_security(overlay, rendered):
    """The "restricted" Pod Security Standard the namespace enforces, and a read-only root."""
    objects = rendered[overlay]
    dep, c, _, _, _ = serve_args(objects)
    pod = dep["spec"]["template"]["spec"]
    ns = one(objects, "Namespace")
    assert ns["metadata"]["name"] == dep["metadata"]["namespace"]
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    psc, csc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0
    assert csc["runAsNonRoot"] is True and csc["runAsUser"] > 0
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and not csc["capabilities"].get("add")
    assert (csc.get("seccompProfile") or psc.get("seccompProfile")) == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert one(objects, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]
    allowed = {"emptyDir", "secret", "configMap", "projected", "downwardAPI", "persistentVolumeClaim", "ephemeral", "csi"}
    for v in pod["volumes"]:
        assert set(v) - {"name"} <= allowed, f"volume {v['name']} has a type the restricted standard forbids"
    # Writable paths: /tmp is an emptyDir, and the images' caches live there.
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])
    image = "Dockerfile.cuda" if overlay.startswith("gpu") else "Dockerfile"
    env = parse_dockerfile(DEPLOY / image)[-1]["env"]
    for var in ("NUMBA_CACHE_DIR", "TRITON_CACHE_DIR", "HOME"):
        if var in env:
            assert env[var] == "/tmp" or env[var].startswith("/tmp/")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_pdb_and_network_policy_match(overlay, rendered):
    objects = rendered[overlay]
    dep, c, _, _, cfg = serve_args(objects)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    ns = dep["metadata"]["namespace"]
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == ns

    svc = one(objects, "Service", "modelinit")
    assert svc["spec"]["clusterIP"] == "None", "headless: clients balance over the pods themselves"
    assert selects({"matchLabels": svc["spec"]["selector"]}, labels)
    container_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    sports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert set(sports) == {"grpc", "metrics"}
    for name, want in (("grpc", cfg.port), ("metrics", cfg.metrics_port)):
        target = sports[name].get("targetPort", sports[name]["port"])
        target = container_ports[target] if isinstance(target, str) else target
        assert sports[name]["port"] == want and target == want, f"Service port {name}"

    pdb = one(objects, "PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"], labels)
    replicas = dep["spec"]["replicas"]
    assert replicas >= 2
    assert 1 <= pdb["spec"].get("maxUnavailable", 1) < replicas

    np = one(objects, "NetworkPolicy")
    assert selects(np["spec"]["podSelector"], labels)
    assert np["spec"]["policyTypes"] == ["Ingress"]
    admitted: dict[str, set[int]] = {}
    for rule in np["spec"]["ingress"]:
        (peer,) = rule["from"]
        assert set(peer) == {"namespaceSelector"}
        (nsname,) = peer["namespaceSelector"]["matchLabels"].items()
        assert nsname[0] == "kubernetes.io/metadata.name"
        admitted[nsname[1]] = {p["port"] for p in rule["ports"]} if all(p.get("protocol", "TCP") == "TCP" for p in rule["ports"]) else set()
    assert admitted == {"training": {cfg.port}, "monitoring": {cfg.metrics_port}}
    job = one(load_examples(), "Job")
    assert job["metadata"]["namespace"] in admitted and cfg.port in admitted[job["metadata"]["namespace"]], \
        "the example training Job's namespace must be admitted to the gRPC port"


def test_init_job_network_policy(rendered):
    """deploy/k8s/init-job's NetworkPolicy: it selects the writer pods (the Job's, `modelinit
    job`'s, the JobSet's) and lets them reach DNS, the store over HTTPS and the servers' gRPC port
    only; nothing may reach them."""
    from modelinit.job import job_manifest

    objects = kustomize(K8S / "init-job")
    job, np = one(objects, "Job"), one(objects, "NetworkPolicy")
    assert np["metadata"]["namespace"] == job["metadata"]["namespace"]
    printed = job_manifest("gpt2", parts=2, out="s3://b/p", server="dns:///x:50051")
    (jobset,) = [o for o in kustomize(K8S / "jobset") if o["kind"] == "JobSet"]
    writers = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "model-initializer")
    for pod_template in (job["spec"]["template"], printed["spec"]["template"], writers["template"]["spec"]["template"]):
        assert selects(np["spec"]["podSelector"], pod_template["metadata"]["labels"])
    assert jobset["metadata"]["namespace"] == np["metadata"]["namespace"]

    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"] and not np["spec"].get("ingress"), "no ingress at all"
    rules = np["spec"]["egress"]
    assert len(rules) == 3
    dns, store, server = rules
    (peer,) = dns["to"]
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
    assert sorted((p["protocol"], p["port"]) for p in dns["ports"]) == [("TCP", 53), ("UDP", 53)]
    assert store["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    assert store["ports"] == [{"protocol": "TCP", "port": 443}]
    # The servers: their namespace and pod labels, on the port `modelinit serve` gets.
    dep, _, _, _, cfg = serve_args(rendered["gpu"])
    (peer,) = server["to"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": dep["metadata"]["namespace"]}}
    assert selects(peer["podSelector"], dep["spec"]["template"]["metadata"]["labels"])
    assert server["ports"] == [{"protocol": "TCP", "port": cfg.port}]


# --- examples: the training Job and Kueue -----------------------------------------------------

def test_training_job_init_container():
    objects = load_examples()
    job = one(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    cmd = init["command"]
    assert cmd[0] == "modelinit"
    args = parse_cli(cmd[1:])
    assert args.command == "init"
    assert args.seed == 42 and args.out == "/ckpt" and args.quiet

    # The target is the headless Service of the rendered server manifests, on its gRPC port.
    server_objects = kustomize(K8S / "overlays" / "gpu")
    svc = one(server_objects, "Service", "modelinit")
    grpc_port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
    assert args.server == f"dns:///{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local:{grpc_port}"

    # The token: MODELINIT_TOKEN (--token's default) names, with @, a file of the modelinit-token
    # Secret mounted into the container, which the CLI reads (not the Secret as an env var).
    (tok,) = [e for e in init["env"] if e["name"] == "MODELINIT_TOKEN"]
    assert set(tok) == {"name", "value"} and tok["value"].startswith("@")
    vol, key = mounted_file(pod, init, tok["value"][1:])
    assert (vol["secret"]["secretName"], key) == ("modelinit-token", "token")
    assert "--token" not in cmd
    assert not init.get("envFrom") and all("secretKeyRef" not in e.get("valueFrom", {}) for e in init["env"])


def test_cli_reads_the_token_from_the_environment(monkeypatch):
    monkeypatch.setenv("MODELINIT_TOKEN", "s3cret")
    cmd = one(load_examples(), "Job")["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert parse_cli(cmd[1:]).token == "s3cret"


def test_training_job_shares_the_weights_volume():
    pod = one(load_examples(), "Job")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    args = parse_cli(init["command"][1:])

    def volume_at(c, path):
        ms = [m for m in c["volumeMounts"] if m["mountPath"] == path]
        assert ms, f"{c['name']} mounts nothing at {path}"
        return ms[0]

    init_mount = volume_at(init, args.out)
    assert not init_mount.get("readOnly")
    (trainer,) = pod["containers"]
    assert volume_at(trainer, args.out)["name"] == init_mount["name"]
    assert args.out in " ".join(trainer["command"] + trainer.get("args", [])), "the trainer starts from the weights"
    assert init_mount["name"] in {v["name"] for v in pod["volumes"]}
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert any(m["mountPath"] == "/tmp" for m in init["volumeMounts"])


def test_kueue_objects():
    objects = load_examples()
    kueue = [o for o in objects if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    assert all(o["apiVersion"] == KUEUE_API for o in kueue)
    assert sorted(o["kind"] for o in kueue) == ["ClusterQueue", "LocalQueue", "ResourceFlavor"]
    flavor, cq, lq = (one(kueue, k) for k in ("ResourceFlavor", "ClusterQueue", "LocalQueue"))
    for cluster_scoped in (flavor, cq):
        assert "namespace" not in cluster_scoped["metadata"]
    job = one(objects, "Job")

    # Job -> LocalQueue -> ClusterQueue -> ResourceFlavor.
    assert job["spec"]["suspend"] is True, "Kueue admits a Job by unsuspending it"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == lq["metadata"]["name"]
    assert lq["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert lq["spec"]["clusterQueue"] == cq["metadata"]["name"]
    ns = one(objects, "Namespace")
    assert ns["metadata"]["name"] == job["metadata"]["namespace"]
    ns_labels = {**ns["metadata"].get("labels", {}), "kubernetes.io/metadata.name": ns["metadata"]["name"]}
    assert selects(cq["spec"]["namespaceSelector"], ns_labels), "the ClusterQueue must accept the training namespace"

    # Resource groups: flavors exist, list exactly the covered resources (Kueue requires the same
    # order), and cover what the Job's pod requests, with enough quota to admit it.
    flavors = {flavor["metadata"]["name"]}
    requests = pod_requests(job["spec"]["template"]["spec"])
    covered_all = set()
    for group in cq["spec"]["resourceGroups"]:
        covered = group["coveredResources"]
        covered_all |= set(covered)
        for f in group["flavors"]:
            assert f["name"] in flavors, f"ClusterQueue flavor {f['name']} has no ResourceFlavor"
            assert [r["name"] for r in f["resources"]] == covered
            for r in f["resources"]:
                need = requests.get(r["name"], 0) * job["spec"].get("parallelism", 1)
                assert quantity(r["nominalQuota"]) >= need, f"quota for {r['name']} cannot admit the example Job"
    assert set(requests) <= covered_all, f"the Job requests {set(requests) - covered_all}, which no resource group covers"


# --- docs -------------------------------------------------------------------------------------

def test_docs_reference_existing_files():
    text = (REPO / "docs" / "deploy.md").read_text()
    for o in OVERLAYS:
        assert f"deploy/k8s/overlays/{o}" in text
    # Repository paths (not kubectl's `deploy/NAME` resource shorthand).
    for path in set(re.findall(r"\b(deploy/(?:k8s|examples)/[\w./-]*\w|deploy/Dockerfile(?:\.\w+)*)", text)):
        assert (REPO / path).exists(), f"docs/deploy.md names {path}, which does not exist"
    assert "What was validated here" in text
