"""One checkpoint from many pods: deploy/k8s/init-job and `modelinit job` (modelinit.job).

- The Kustomize base renders with `kubectl kustomize` and validates strictly (kubernetes-validate,
  every Kubernetes version >= 1.29 it ships), and is exactly what `modelinit job` prints for the
  same request, so the two cannot drift.
- Every Job (the base, and `modelinit job` with GPUs, a server, a shared volume, no Kueue) is an
  Indexed Job of N pods queued by Kueue, with per-index retries, and its args, once the kubelet
  has put each pod's completion index in place of $(MODELINIT_PART), parse with the real
  `modelinit` parser as `init ... --part K/N` for K in 0..N-1.
- Bad flags are one-line INVALID_ARGUMENT errors naming the flag; `plan --parts` splits the
  shards as `init --part` does and balances their bytes.
"""
from __future__ import annotations

import argparse
import subprocess
import sys

import grpc
import pytest
import yaml
from modelinit import job as mjob
from modelinit.errors import ModelInitError
from modelinit.parts import Part, parse_part, split_shards
from modelinit_wire.v1 import modelinit_pb2 as pb

from tests.support.deploy import (
    validate_strict,
    DEPLOY,
    K8S,
    SCHEMA_VERSIONS,
    container_env,
    expand,
    load_examples,
    one,
    parse_cli,
    parse_dockerfile,
    pod_requests,
    quantity,
)

INIT_JOB = K8S / "init-job"
#: The request of deploy/k8s/init-job/job.yaml.
BASE = dict(parts=16, out="s3://checkpoints/deepseek-v3-bf16-seed42", seed=42, dtype="bfloat16",
            name="modelinit-init-deepseek-v3", secret=mjob.SECRET, service_account="modelinit-init")


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    from tests.support.deploy import kustomize

    return kustomize(INIT_JOB)


def job_parser() -> argparse.ArgumentParser:
    """A `modelinit`-like parser with only the `job` command, as cli.py adds it."""
    parser = argparse.ArgumentParser(prog="modelinit")
    mjob.add_job_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def run_job(argv: list[str], capsys) -> dict:
    """The one YAML document `modelinit job ARGV` prints."""
    assert mjob.run_job(job_parser().parse_args(["job", *argv])) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert len(docs) == 1 and docs[0]["kind"] == "Job"
    return docs[0]


def validate(obj: dict) -> None:
    for version in SCHEMA_VERSIONS:
        validate_strict(obj, version)


def the_container(job: dict) -> dict:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["name"] == mjob.CONTAINER
    return c


def part_args(job: dict, index: int) -> list[str]:
    """The container's argv once the kubelet has expanded $(VAR) for the pod of ``index``."""
    c = the_container(job)
    env = container_env(c, [], job["metadata"]["namespace"])
    (part,) = [e for e in c["env"] if e["name"] == mjob.PART_ENV]
    # The value the Job controller gives pod `index` (and JOB_COMPLETION_INDEX).
    assert part["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    env[mjob.PART_ENV] = str(index)
    return [expand(a, env) for a in c["args"]]


def check_indexed_job(job: dict) -> argparse.Namespace:
    """What every Job here must be; returns pod 0's parsed `init` args."""
    spec = job["spec"]
    pod = spec["template"]["spec"]
    c = the_container(job)
    n = spec["completions"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == n >= 1
    assert spec["backoffLimitPerIndex"] >= 1 and "backoffLimit" not in spec and "maxFailedIndexes" not in spec
    assert spec["podReplacementPolicy"] == "Failed", "two pods of one index must never write at once"
    assert pod["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    assert {"action": "FailJob", "onExitCodes": {"containerName": c["name"], "operator": "In", "values": [2]}} in rules
    assert c["command"] == ["modelinit"], "the server images' ENTRYPOINT is `modelinit serve`"
    labels = spec["template"]["metadata"]["labels"]
    assert labels.get("app.kubernetes.io/name") != "modelinit", "the server's Service and PDB select that label"
    assert len(job["metadata"]["name"]) + len(f"-{n - 1}") <= 63, "pod hostnames <name>-<index> are DNS labels"

    for k in range(n):
        args = parse_cli(part_args(job, k))
        assert args.command == "init" and args.quiet
        assert parse_part(args.part) == Part(k, n)
    # Requests = limits, and the pod security of the server's Deployment (restricted standard).
    assert c["resources"]["requests"] == c["resources"]["limits"]
    psc, csc = pod["securityContext"], c["securityContext"]
    uid = int(parse_dockerfile(DEPLOY / "Dockerfile")[-1]["user"].split(":")[0])
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == csc["runAsUser"] == uid
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]} and csc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    return parse_cli(part_args(job, 0))


def check_kueue(job: dict) -> None:
    """Queued on the examples' LocalQueue, suspended, and its N pods fit the ClusterQueue's quota."""
    kueue = load_examples()
    lq, cq = one(kueue, "LocalQueue"), one(kueue, "ClusterQueue")
    assert job["spec"]["suspend"] is True, "Kueue admits a Job by unsuspending it"
    assert job["metadata"]["labels"][mjob.QUEUE_LABEL] == lq["metadata"]["name"]
    assert job["metadata"]["namespace"] == lq["metadata"]["namespace"]
    requests = pod_requests(job["spec"]["template"]["spec"])
    (group,) = cq["spec"]["resourceGroups"]
    assert set(requests) <= set(group["coveredResources"]), "Kueue refuses a Job requesting an uncovered resource"
    quota = {r["name"]: quantity(r["nominalQuota"]) for r in group["flavors"][0]["resources"]}
    for name, per_pod in requests.items():
        assert per_pod * job["spec"]["parallelism"] <= quota[name], f"{name}: the quota cannot admit the Job's pods"


# --- deploy/k8s/init-job ----------------------------------------------------------------------

@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_init_job_validates_against_kubernetes_schema(rendered, version):
    assert sorted(o["kind"] for o in rendered) == ["Job", "NetworkPolicy", "ServiceAccount"]
    for obj in rendered:
        validate_strict(obj, version)


def check_store_secret(job, name: str) -> None:
    """The store's Secret ``name`` is an optional volume of files named by MODELINIT_STORE_SECRETS, never
    env vars' values (checkov's CKV_K8S_35: secrets as files)."""
    c = the_container(job)
    assert "envFrom" not in c and not any("secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
    assert {"name": "MODELINIT_STORE_SECRETS", "value": mjob.STORE_DIR} in c["env"]
    assert {"name": "store", "mountPath": mjob.STORE_DIR, "readOnly": True} in c["volumeMounts"]
    vol = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "store")
    assert vol["secret"] == {"secretName": name, "optional": True, "defaultMode": 0o440}


def test_init_job_base(rendered):
    job = one(rendered, "Job")
    args = check_indexed_job(job)
    check_kueue(job)
    assert job["spec"]["completions"] == BASE["parts"]
    assert (args.spec, args.seed, args.dtype, args.out, args.device) == ("deepseek-v3", 42, "bfloat16", BASE["out"], "cpu")
    pod = job["spec"]["template"]["spec"]
    sa = one(rendered, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] and sa["metadata"]["namespace"] == job["metadata"]["namespace"]
    check_store_secret(job, mjob.SECRET)
    # The server images of the overlays, where `modelinit init` runs embedded.
    overlay = (K8S / "overlays" / "cpu" / "kustomization.yaml").read_text()
    (img,) = yaml.safe_load(overlay)["images"]
    assert the_container(job)["image"] == f"{img['newName']}:{img['newTag']}" == f"{mjob.IMAGE}-cpu"


def test_init_job_base_is_what_modelinit_job_prints(rendered):
    assert mjob.job_manifest("deepseek-v3", **BASE) == one(rendered, "Job")


# --- modelinit job ----------------------------------------------------------------------------

VARIANTS = {
    "s3": ["deepseek-v3", "--parts", "16", "--out", "s3://ckpt/ds3", "--dtype", "bfloat16", "--seed", "7"],
    "gpus": ["llama-3-8b", "--parts", "4", "--out", "gs://ckpt/llama", "--gpus", "1", "--cpu", "8", "--memory", "16Gi",
             "--policy", "megatron", "--max-shard-size", "2GB", "--algorithm-version", "2", "--service-account", "writer"],
    "server": ["gpt2", "--parts", "3", "--out", "az://ckpt/gpt2", "--server", "dns:///modelinit.modelinit.svc.cluster.local:50051",
               "--secret", "store", "--name", "gpt2-init", "--namespace", "training", "--image", "reg.example.com/mi:1"],
    "pvc": ["bert-base-uncased", "--parts", "2", "--out", "file:///ckpt/bert", "--pvc", "shared-ckpt"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_modelinit_job_prints_a_valid_indexed_job(variant, capsys):
    argv = VARIANTS[variant]
    job = run_job(argv, capsys)
    validate(job)
    args = check_indexed_job(job)
    check_kueue(job)
    n = int(argv[argv.index("--parts") + 1])
    assert job["spec"]["completions"] == n
    assert args.spec == argv[0] and args.out == argv[argv.index("--out") + 1]
    c = the_container(job)
    if variant == "gpus":
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and args.device == "cuda"
        assert c["image"] == f"{mjob.IMAGE}-cuda"
        assert (args.policy, args.max_shard_size, args.algorithm_version) == ("megatron", "2GB", 2)
    if variant == "server":
        env = {e["name"]: e for e in c["env"]}
        # The token is a file of the mounted Secret, never an env var's value (secrets as files).
        assert env["MODELINIT_TOKEN"] == {"name": "MODELINIT_TOKEN", "value": f"@{mjob.TOKEN_DIR}/token"}
        assert not any("secretKeyRef" in e.get("valueFrom", {}) for e in c["env"])
        (tmount,) = [m for m in c["volumeMounts"] if m["name"] == "token"]
        assert tmount == {"name": "token", "mountPath": mjob.TOKEN_DIR, "readOnly": True}
        tvol = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "token")
        assert tvol["secret"]["secretName"] == mjob.TOKEN_SECRET
        assert tvol["secret"]["items"] == [{"key": "token", "path": "token"}]
        assert args.server.startswith("dns:///") and job["metadata"]["name"] == "gpt2-init"
        check_store_secret(job, "store")
    if variant == "pvc":
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "checkpoint"]
        assert mount["mountPath"] == "/ckpt/bert"
        vol = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "checkpoint")
        assert vol["persistentVolumeClaim"] == {"claimName": "shared-ckpt"}


def test_without_kueue(capsys):
    job = run_job(["gpt2", "--parts", "2", "--out", "s3://b/p", "--queue", ""], capsys)
    validate(job)
    assert "suspend" not in job["spec"] and mjob.QUEUE_LABEL not in job["metadata"]["labels"]


def test_default_name_is_a_stable_dns_label():
    name = mjob.job_manifest("deepseek-v3", parts=16, out="s3://b/p")["metadata"]["name"]
    assert name.startswith("modelinit-init-deepseek-v3-")
    assert name == mjob.job_manifest("deepseek-v3", parts=16, out="s3://b/p")["metadata"]["name"]
    others = {mjob.job_manifest("deepseek-v3", **kw)["metadata"]["name"] for kw in
              (dict(parts=16, out="s3://b/q"), dict(parts=8, out="s3://b/p"), dict(parts=16, out="s3://b/p", seed=1))}
    assert name not in others and len(others) == 3
    long = mjob.job_manifest("Some/Very_Long.Model-Name" * 5, parts=10_000, out="s3://b/p")["metadata"]["name"]
    assert len(long) + len("-9999") <= 63 and mjob._LABEL.match(long)


def test_dollar_signs_reach_init_literally(capsys):
    job = run_job(["weird$(HOME)", "--parts", "2", "--out", "s3://b/p$$q"], capsys)
    args = parse_cli(part_args(job, 1))
    assert args.spec == "weird$(HOME)" and args.out == "s3://b/p$$q" and args.part == "1/2"


BAD = [
    (["--parts", "0"], "--parts"),
    (["--parts", "10001"], "--parts"),
    (["--out", "ckpt/run1"], "--out"),
    (["--out", "/mnt/ckpt"], "--out"),
    (["--out", "http://example.com/x"], "--out"),
    (["--out", "s3://"], "--out"),
    (["--out", "file:///tmp/x", "--pvc", "claim"], "--out"),
    (["--pvc", "claim"], "--pvc"),
    (["--seed", "-1"], "--seed"),
    (["--dtype", "fp8"], "--dtype"),
    (["--policy", "my-policy.yaml"], "--policy"),
    (["--max-shard-size", "5XB"], "--max-shard-size"),
    (["--max-shard-size", "99999999999999TB"], "--max-shard-size"),  # the server's bound (modelinit_wire.sizes), not only its units
    (["--algorithm-version", "9"], "--algorithm-version"),
    (["--name", "Bad_Name"], "--name"),
    (["--name", "n" * 62], "--name"),  # fits alone, not with "-3"
    (["--namespace", "Training"], "--namespace"),
    (["--queue", "bad queue"], "--queue"),
    (["--secret", "UPPER"], "--secret"),
    (["--service-account", "a b"], "--service-account"),
    (["--cpu", "four"], "--cpu"),
    (["--memory", "0"], "--memory"),
    (["--gpus", "-1"], "--gpus"),
    (["--gpus", "1", "--device", "cpu"], "--gpus"),
    (["--device", "cuda"], "--device"),
    (["--gpus", "1", "--server", "h:1"], "--gpus"),
    (["--image", "has space"], "--image"),
]


@pytest.mark.parametrize("extra, flag", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_flags_are_one_line_errors_naming_the_flag(extra, flag, capsys):
    argv = ["gpt2", "--parts", "4", "--out", "s3://b/p"]
    for i in range(0, len(extra), 2):  # a later --parts / --out replaces the default one
        if extra[i] in argv:
            del argv[argv.index(extra[i]):argv.index(extra[i]) + 2]
    with pytest.raises(ModelInitError) as e:
        mjob.run_job(job_parser().parse_args(["job", *argv, *extra]))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details.startswith(f"{flag}:") and "\n" not in e.value.details, e.value.details
    assert capsys.readouterr().out == "", "nothing is printed for bad input"


@pytest.mark.parametrize("spec", ["config.json", __file__])
def test_local_config_files_are_refused(spec):
    with pytest.raises(ModelInitError, match="SPEC: .*the pods cannot read it"):
        mjob.job_manifest(spec, parts=2, out="s3://b/p")


def test_job_module_is_import_light():
    """Not even yaml: the CLI imports this module for every command, and only `modelinit job`
    prints YAML."""
    code = ("import sys, modelinit.cli; "
            "print(sorted(m for m in ('torch', 'numpy', 'numba', 'modelinit_server', 'yaml') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- modelinit plan --parts N --rate R --------------------------------------------------------

SIZES = [4_900, 4_800, 5_000, 3_100, 4_950, 1_200, 2_600]


def fake_plan() -> pb.PlanResponse:
    """7 shards of different sizes, then the index and config.json, as a PlanResponse lists them."""
    files = [pb.FilePlan(name=f"model-{i + 1:05d}-of-00007.safetensors", size=s, shard=True, tensors=3) for i, s in enumerate(SIZES)]
    files += [pb.FilePlan(name="model.safetensors.index.json", size=700), pb.FilePlan(name="config.json", size=300)]
    return pb.PlanResponse(files=files, total_bytes=sum(SIZES) - 7 * 100)


def test_parts_table_sums_and_balances(capsys):
    plan = fake_plan()
    mjob.print_parts(plan, 3, 1000.0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == mjob.parts_table(plan, 3, 1000.0)
    assert lines[0].startswith("model: 7 shard(s) in 3 parts")
    assert lines[1].split()[:4] == ["part", "shards", "bytes", "size"]
    rows = [line.split() for line in lines[2:5]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    loads = [int(r[2].replace(",", "")) for r in rows]
    split = split_shards(SIZES + [700, 300], [True] * 7 + [False, False], 3)
    assert loads == [sum(SIZES[i] for i in p) for p in split]
    assert [int(r[1]) for r in rows] == [len(p) for p in split]
    assert sum(loads) == sum(SIZES) and max(loads) - min(loads) <= max(SIZES)
    assert f"7 shard(s), {sum(SIZES):,} bytes" in lines[5] and "2 small file(s), 1,000 bytes" in lines[5]
    # Times at 1000 bytes/s: each part's bytes, the largest part, one writer for every file.
    assert [r[-1] for r in rows] == [mjob._duration(b / 1000.0) for b in loads]
    assert lines[6].startswith(f"time: {mjob._duration(max(loads) / 1000)} with 3 writers")  # parts, not pods: plan runs anywhere
    assert len(lines) == 7  # every part has a shard: no note
    assert f"{mjob._duration((sum(SIZES) + 1000) / 1000)} with one writer" in lines[6]


def test_parts_table_more_parts_than_shards():
    lines = mjob.parts_table(fake_plan(), 9, mjob.DEFAULT_RATE)
    assert sum(int(line.split()[1]) for line in lines[2:11]) == 7 and lines[11].startswith("total: 7 shard(s)")
    # the two parts with nothing to write, said in one line with the two ways to give each a shard
    assert lines[13] == (f"part(s) 7, 8 of 9 have no shard to write: the plan has 7 shard(s) at max_shard_size 5GB; "
                         f"for a shard each, use at most 7 part(s), or a smaller --max-shard-size (about "
                         f"{sum(SIZES) // 9}B for 9 shards of these {sum(SIZES) // 1000}KB)")  # 2950B, 26KB


@pytest.mark.parametrize("text, rate", [("0.5GB/s", 5e8), ("500MB/s", 5e8), ("500MB", 5e8), ("1GiB/s", 2**30), ("4096", 4096)])
def test_parse_rate(text, rate):
    assert mjob.parse_rate(text) == rate


@pytest.mark.parametrize("text", ["fast", "0GB/s", "-1GB/s", "1XB/s"])
def test_bad_rate(text):
    with pytest.raises(ModelInitError) as e:
        mjob.parse_rate(text)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and e.value.details.startswith("--rate:")


def test_parts_table_checks_its_arguments():
    for count, rate, flag in ((0, 1.0, "--parts"), (2, 0.0, "--rate")):
        with pytest.raises(ModelInitError, match=f"^INVALID_ARGUMENT: {flag}:"):
            mjob.parts_table(fake_plan(), count, rate)


def test_examples_and_base_share_the_queue():
    """The base's Job is queued where deploy/examples puts training Jobs (one LocalQueue)."""
    assert mjob.QUEUE == one(load_examples(), "LocalQueue")["metadata"]["name"]
    assert mjob.NAMESPACE == one(load_examples(), "Job")["metadata"]["namespace"]
