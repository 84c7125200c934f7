"""Offline checks of the Kubeflow Trainer v2 and JobSet pieces of deploy/ (no cluster needed).

- deploy/k8s/kubeflow-trainer (a ClusterTrainingRuntime), deploy/examples/trainjob.yaml (a TrainJob
  naming it) and deploy/k8s/jobset (a plain JobSet) render with `kubectl kustomize` and load into the
  published API types: the pydantic models of PyPI ``kubeflow-trainer-api`` (Kubeflow Trainer
  ``trainer.kubeflow.org/v1alpha1`` and the JobSet ``jobset.x-k8s.io/v1alpha2`` it embeds). Those
  models ignore unknown fields, so each object must also come back unchanged from the model
  (``to_dict``): a field the types do not have is reported, as in strict mode. The Job templates
  inside (every replicated job) and the PVC templates validate strictly with kubernetes-validate
  against every Kubernetes version >= 1.29 it ships, as test_deploy.py does for built-in kinds.
- The model-initializer's command is a real `modelinit init` command line: its args, with $(VAR)
  expanded as the kubelet does (after the TrainJob's env replaced the runtime's, as the Trainer
  controller does), parse with `modelinit.cli.build_parser()`; the trainer nodes mount the volume it
  writes, at the --out path, read-only, and start only once the initializer is Complete.

What the published types do not cover, and is not checked: the CRDs' own OpenAPI schemas and CEL
rules (kubeflow/trainer's and kubernetes-sigs/jobset's CRD YAML is on GitHub only, not on a package
registry), the admission webhooks, and enum values the models type as plain strings.
"""
from __future__ import annotations

import copy

import pydantic
import pytest
import yaml
from kubeflow_trainer_api.models import (
    JobsetV1alpha2JobSet,
    TrainerV1alpha1ClusterTrainingRuntime,
    TrainerV1alpha1TrainJob,
)

from tests.support import REPO
from tests.support.deploy import (
    validate_strict,
    EXAMPLES,
    K8S,
    SCHEMA_VERSIONS,
    container,
    container_env,
    expand,
    kustomize,
    one,
    parse_cli,
)

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
RUNTIME_DIR = K8S / "kubeflow-trainer"
JOBSET_DIR = K8S / "jobset"
TRAINJOB = EXAMPLES / "trainjob.yaml"
# The names Kubeflow Trainer gives its steps (kubeflow SDK 0.5.0, kubeflow.trainer.constants:
# MODEL_INITIALIZER, NODE, TRAINJOB_ANCESTOR_LABEL): the controller finds the model initializer's
# Job by the ancestor label on the Job template and its container by name, and the trainer's Job
# by the label value "trainer" and its container "node".
MODEL_INITIALIZER = "model-initializer"
NODE = "node"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
SHARED_VOLUME = "initializer"


# --- loading into the published types ---------------------------------------------------------

def dropped(cls, obj: dict) -> list[str]:
    """Paths of what ``obj`` holds and the published model ``cls`` does not keep (unknown fields);
    a wrongly typed value fails the test with pydantic's reason."""
    try:
        back = cls.from_dict(copy.deepcopy(obj)).to_dict()
    except pydantic.ValidationError as e:
        pytest.fail(f"{obj.get('kind')}/{obj['metadata']['name']} does not load into {cls.__name__}: {e}")

    def walk(a, b, path):
        if isinstance(a, dict):
            if not isinstance(b, dict):
                return [path or "."]
            return [p for k, v in a.items() for p in (walk(v, b[k], f"{path}.{k}") if k in b else [f"{path}.{k}"])]
        if isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return [path]
            return [p for i, (x, y) in enumerate(zip(a, b)) for p in walk(x, y, f"{path}[{i}]")]
        return [] if a == b else [f"{path} ({a!r} -> {b!r})"]

    return walk(obj, back, "")


def check_published(cls, obj: dict) -> None:
    lost = dropped(cls, obj)
    assert not lost, f"{obj['kind']}/{obj['metadata']['name']}: not in the published {cls.__name__}: {lost}"


@pytest.fixture(scope="module")
def runtime_objects() -> list[dict]:
    return kustomize(RUNTIME_DIR)


@pytest.fixture(scope="module")
def jobset_objects() -> list[dict]:
    return kustomize(JOBSET_DIR)


@pytest.fixture(scope="module")
def runtime(runtime_objects) -> dict:
    return one(runtime_objects, "ClusterTrainingRuntime")


@pytest.fixture(scope="module")
def jobset(jobset_objects) -> dict:
    return one(jobset_objects, "JobSet")


@pytest.fixture(scope="module")
def trainjob() -> dict:
    (obj,) = [d for d in yaml.safe_load_all(TRAINJOB.read_text()) if d]
    return obj


def test_installed_types():
    from importlib.metadata import version

    assert tuple(int(p) for p in version("kubeflow-trainer-api").split(".")[:2]) >= (2, 3)


def test_kustomizations_render_only_the_new_kinds(runtime_objects, jobset_objects):
    assert [(o["apiVersion"], o["kind"]) for o in runtime_objects] == [(TRAINER_API, "ClusterTrainingRuntime")]
    assert "namespace" not in runtime_objects[0]["metadata"], "ClusterTrainingRuntime is cluster-scoped"
    assert [(o["apiVersion"], o["kind"]) for o in jobset_objects] == [(JOBSET_API, "JobSet")]


def test_objects_load_into_the_published_types(runtime, trainjob, jobset):
    assert (trainjob["apiVersion"], trainjob["kind"]) == (TRAINER_API, "TrainJob")
    check_published(TrainerV1alpha1ClusterTrainingRuntime, runtime)
    check_published(TrainerV1alpha1TrainJob, trainjob)
    check_published(JobsetV1alpha2JobSet, jobset)


def test_published_type_check_is_strict(runtime, trainjob):
    """A misspelt field, one the published types do not have, or a wrongly typed value fails."""
    bad = copy.deepcopy(runtime)
    bad["spec"]["template"]["spec"]["replicatedJobs"][1]["dependOn"] = [{"name": MODEL_INITIALIZER, "status": "Complete"}]
    assert dropped(TrainerV1alpha1ClusterTrainingRuntime, bad) == [".spec.template.spec.replicatedJobs[1].dependOn"]
    bad = copy.deepcopy(runtime)
    bad["spec"]["mlPolicy"]["torch"]["numProcPerNode"] = "auto"  # moved to TrainJob.spec.trainer in the 2.x types
    assert dropped(TrainerV1alpha1ClusterTrainingRuntime, bad) == [".spec.mlPolicy.torch.numProcPerNode"]
    bad = copy.deepcopy(trainjob)
    bad["spec"]["initializer"]["model"]["env"][1]["value"] = 1234  # env values are strings
    with pytest.raises(pytest.fail.Exception):
        dropped(TrainerV1alpha1TrainJob, bad)


def job_templates(obj: dict) -> list[tuple[str, dict]]:
    """(replicated job name, its Job template as a batch/v1 Job) of a runtime or a JobSet."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "ClusterTrainingRuntime" else obj["spec"]
    out = []
    for rj in spec["replicatedJobs"]:
        meta = {"name": f"{obj['metadata']['name']}-{rj['name']}", **rj["template"].get("metadata", {})}
        out.append((rj["name"], {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": rj["template"]["spec"]}))
    for policy in spec.get("volumeClaimPolicies") or []:
        for pvc in policy["templates"]:
            out.append((pvc["metadata"]["name"], {"apiVersion": "v1", "kind": "PersistentVolumeClaim", **pvc}))
    return out


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_job_and_volume_templates_validate_against_kubernetes_schema(version, runtime, jobset):
    for obj in (runtime, jobset):
        for name, job in job_templates(obj):
            validate_strict(job, version, f"{obj['kind']}/{obj['metadata']['name']} {name}: ")


# --- what the pods run and share --------------------------------------------------------------

def jobset_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "ClusterTrainingRuntime" else obj["spec"]


def replicated(obj: dict, name: str) -> dict:
    (rj,) = [r for r in jobset_spec(obj)["replicatedJobs"] if r["name"] == name]
    return rj


def claim_templates(obj: dict) -> dict[str, dict]:
    return {t["metadata"]["name"]: t for p in jobset_spec(obj).get("volumeClaimPolicies") or [] for t in p["templates"]}


def mount_at(c: dict, path: str) -> dict:
    ms = [m for m in c.get("volumeMounts") or [] if m["mountPath"] == path]
    assert ms, f"{c['name']} mounts nothing at {path}"
    return ms[0]


def check_volumes(obj: dict) -> None:
    """Every mount names a volume of the pod or a volumeClaimPolicies template (which JobSet adds to
    the pod, and which the pod must then not declare itself)."""
    claims = set(claim_templates(obj))
    for rj in jobset_spec(obj)["replicatedJobs"]:
        pod = rj["template"]["spec"]["template"]["spec"]
        declared = {v["name"] for v in pod.get("volumes") or []}
        assert not declared & claims, f"{rj['name']} declares {declared & claims}, which JobSet adds itself"
        for c in pod["containers"] + (pod.get("initContainers") or []):
            for m in c.get("volumeMounts") or []:
                assert m["name"] in declared | claims, f"{rj['name']}/{c['name']} mounts {m['name']}, which nothing provides"


def check_writer_pod(pod: dict, c: dict) -> None:
    """The restricted Pod Security Standard and the conventions of deploy/k8s/init-job."""
    psc, csc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001 and psc["fsGroup"] == 10001
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"] and not csc["capabilities"].get("add")
    assert (csc.get("seccompProfile") or psc.get("seccompProfile")) == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    tmp = mount_at(c, "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert c["command"] == ["modelinit"], "the image's ENTRYPOINT is `modelinit serve`"
    assert c["image"] == "registry.example.com/ml-platform/modelinit:0.1.0-cpu", "the kustomization's images: entry"
    assert c["resources"]["requests"] == c["resources"]["limits"]
    numba = [e for e in c["env"] if e["name"] == "NUMBA_NUM_THREADS"]
    assert numba and numba[0]["valueFrom"]["resourceFieldRef"] == {"containerName": c["name"], "resource": "limits.cpu"}


def fails_job_on_bad_input(job_spec: dict, container_name: str) -> bool:
    return any(r["action"] == "FailJob" and r["onExitCodes"] == {"containerName": container_name, "operator": "In", "values": [2]}
               for r in job_spec["podFailurePolicy"]["rules"] if "onExitCodes" in r)


def initializer_args(runtime: dict, trainjob: dict | None = None, extra_env: list[dict] | None = None):
    """The model-initializer container as the Trainer controller builds it for ``trainjob`` (its
    spec.initializer.model.env replaces the runtime's variables of the same name, in place, and adds
    the others), and its args parsed by the real `modelinit` parser after the kubelet's $(VAR)
    expansion: (container, parsed args)."""
    rj = replicated(runtime, MODEL_INITIALIZER)
    c = copy.deepcopy(container(rj["template"]["spec"]["template"]["spec"], MODEL_INITIALIZER))
    overrides = list(((trainjob or {}).get("spec", {}).get("initializer", {}).get("model", {}) or {}).get("env") or [])
    for e in overrides + (extra_env or []):
        names = [x["name"] for x in c["env"]]
        if e["name"] in names:
            c["env"][names.index(e["name"])] = e
        else:
            c["env"].append(e)
    env = container_env(c, [], "")
    return c, parse_cli([expand(a, env) for a in c["args"]])


def test_runtime_model_initializer_runs_modelinit_init(runtime):
    rj = replicated(runtime, MODEL_INITIALIZER)
    assert rj["template"]["metadata"]["labels"][ANCESTOR] == MODEL_INITIALIZER, "how the controller finds the step"
    assert rj.get("replicas", 1) == 1
    job = rj["template"]["spec"]
    pod = job["template"]["spec"]
    c = container(pod, MODEL_INITIALIZER)
    assert c["args"][0] == "init"
    c, args = initializer_args(runtime)
    assert args.command == "init"
    assert (args.spec, args.seed, args.dtype, args.device) == ("llama-3-8b", 42, "bfloat16", "cpu")
    assert args.quiet and args.part is None
    check_writer_pod(pod, c)
    assert pod["restartPolicy"] == "Never" and fails_job_on_bad_input(job, MODEL_INITIALIZER)
    # It writes into the shared volume; store credentials are optional (needed only for a bucket).
    assert mount_at(c, args.out)["name"] == SHARED_VOLUME and not mount_at(c, args.out).get("readOnly")
    # ... as files of the optional modelinit-store Secret, never env vars' values (checkov's CKV_K8S_35)
    assert "envFrom" not in c and {"name": "MODELINIT_STORE_SECRETS", "value": "/var/run/modelinit-store"} in c["env"]
    assert {"name": "store", "mountPath": "/var/run/modelinit-store", "readOnly": True} in c["volumeMounts"]
    vol = next(v for v in pod["volumes"] if v["name"] == "store")
    assert vol["secret"] == {"secretName": "modelinit-store", "optional": True, "defaultMode": 0o440}


def test_trainjob_changes_the_request_through_env(runtime, trainjob):
    ref = trainjob["spec"]["runtimeRef"]
    assert ref == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": runtime["metadata"]["name"]}
    assert trainjob["metadata"]["namespace"] == "training"
    _, args = initializer_args(runtime, trainjob)
    assert (args.spec, args.seed, args.dtype) == ("llama-3-8b", 1234, "bfloat16")
    assert args.out == "/workspace/model"
    assert str(args.seed) in trainjob["metadata"]["name"]
    # The bucket variant the comments describe: the same command line, --out a bucket.
    _, args = initializer_args(runtime, trainjob, [{"name": "MODELINIT_OUT", "value": "s3://checkpoints/llama-3-8b-bf16-seed1234"}])
    assert args.out == "s3://checkpoints/llama-3-8b-bf16-seed1234" and args.seed == 1234
    # storageUri is the upstream initializers' download source: modelinit has none to read.
    assert "storageUri" not in trainjob["spec"]["initializer"]["model"]


def test_runtime_trainer_reads_what_the_initializer_wrote(runtime, trainjob):
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert "torch" in runtime["spec"]["mlPolicy"]
    check_volumes(runtime)
    claim = claim_templates(runtime)[SHARED_VOLUME]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every node of a multi-node TrainJob mounts it"
    _, args = initializer_args(runtime, trainjob)
    node = replicated(runtime, NODE)
    assert node["template"]["metadata"]["labels"][ANCESTOR] == "trainer"
    assert node["dependsOn"] == [{"name": MODEL_INITIALIZER, "status": "Complete"}], "nodes start once the weights are written"
    pod = node["template"]["spec"]["template"]["spec"]
    c = container(pod, NODE)
    m = mount_at(c, args.out)
    assert m["name"] == SHARED_VOLUME and m.get("readOnly") is True
    assert pod["securityContext"]["fsGroup"] == 10001 and pod["automountServiceAccountToken"] is False
    # The TrainJob's trainer.command replaces the runtime's (the controller's Trainer step).
    for command in (c["command"] + c.get("args", []), trainjob["spec"]["trainer"]["command"]):
        assert args.out in " ".join(command), "the trainer starts from the weights"
    assert trainjob["spec"]["trainer"]["numNodes"] >= 1


def test_jobset_parts_write_one_checkpoint_the_trainer_reads(jobset):
    assert jobset["metadata"]["namespace"] == "training"
    check_volumes(jobset)
    assert claim_templates(jobset)[SHARED_VOLUME]["spec"]["accessModes"] == ["ReadWriteMany"], "N writers on any nodes"
    init = replicated(jobset, MODEL_INITIALIZER)
    job = init["template"]["spec"]
    n = job["completions"]
    assert init.get("replicas", 1) == 1 and job["completionMode"] == "Indexed" and job["parallelism"] == n > 1
    assert job["backoffLimitPerIndex"] >= 1 and job["podReplacementPolicy"] == "Failed"
    pod = job["template"]["spec"]
    (c,) = pod["containers"]
    check_writer_pod(pod, c)
    assert pod["restartPolicy"] == "Never" and fails_job_on_bad_input(job, c["name"])
    (part,) = [e for e in c["env"] if e["name"] == "MODELINIT_PART"]
    assert part["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    outs = set()
    for k in range(n):
        env = {**container_env(c, [], ""), "MODELINIT_PART": str(k)}
        args = parse_cli([expand(a, env) for a in c["args"]])
        assert args.command == "init" and args.part == f"{k}/{n}"
        assert (args.spec, args.seed, args.dtype) == ("llama-3-70b", 42, "bfloat16")
        outs.add(args.out)
    (out,) = outs
    assert mount_at(c, out)["name"] == SHARED_VOLUME and not mount_at(c, out).get("readOnly")

    node = replicated(jobset, NODE)
    assert node["dependsOn"] == [{"name": MODEL_INITIALIZER, "status": "Complete"}], "every part is written first"
    (trainer,) = node["template"]["spec"]["template"]["spec"]["containers"]
    m = mount_at(trainer, out)
    assert m["name"] == SHARED_VOLUME and m.get("readOnly") is True
    assert out in " ".join(trainer["command"] + trainer.get("args", []))
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 0


# --- docs -------------------------------------------------------------------------------------

def test_docs_recipe_and_readme():
    text = (REPO / "docs" / "deploy.md").read_text()
    for path in ("deploy/k8s/kubeflow-trainer", "deploy/examples/trainjob.yaml", "deploy/k8s/jobset"):
        assert path in text, f"docs/deploy.md does not name {path}"
    assert "kubectl apply -k deploy/k8s/kubeflow-trainer" in text
    assert "kubectl create -f deploy/examples/trainjob.yaml" in text
    readme = (REPO / "README.md").read_text()
    paragraphs = [p for p in readme.split("\n\n") if "Kueue" in p and "Kubeflow Trainer" in p and "modelinit.ray" in p]
    assert paragraphs, "README's scale-out paragraph names the Indexed Job + Kueue, Ray and Kubeflow Trainer"
