"""Offline checks of the operators' monitoring in deploy/monitoring (no cluster, no Prometheus).

- `kubectl kustomize deploy/monitoring` renders a PodMonitor, a PrometheusRule and the Grafana
  dashboard's ConfigMap; the ConfigMap validates with kubernetes-validate (strict) for every
  Kubernetes version >= 1.29 it ships, and carries the dashboard file as it is.
- PrometheusRule and PodMonitor validate against the prometheus-operator CRD schemas (the
  validators @kubernetes-models/prometheus-operator generates from them), and hold no field
  those CRDs lack (the generated validators do not refuse unknown fields: checked here).
- Every PromQL expression, the alerts' and the dashboard's (after Grafana's variables are
  interpolated as Grafana does), is parsed by Prometheus' own grammar (@prometheus-io/lezer-promql)
  with no error node and type-checked by codemirror-promql's port of Prometheus' parser checks;
  each is an instant vector. The checkers are shown to refuse bad input too.
- Every metric those expressions select is one a real `modelinit serve --metrics-port` exports,
  read from its /metrics after a real Plan and Init; their label matchers and grouping labels
  are labels those series carry (or that a Kubernetes scrape adds); `code`, `method` and
  `reason` values are real status codes, methods of the proto and rejection reasons; rate() and
  increase() take counters only. Every exported family appears on the dashboard.
- The alerts: severity, summary, description, `for`; each one documented in docs/deploy.md's
  Monitoring section; the max-streams in the saturation alert and the dashboard is the
  ConfigMap's. The PodMonitor selects the Deployment's pods and names its metrics port.
"""
from __future__ import annotations

import json
import re
import urllib.request

import grpc
import modelinit
import pytest
from modelinit import ModelInitError
from modelinit_server.service.observability import REJECT_REASONS
from modelinit_wire.v1 import modelinit_pb2

from tests.support import REPO, TINY, WAIT, ServerProcess, wait_until
from tests.support.deploy import DEPLOY, K8S, SCHEMA_VERSIONS, kustomize, one, selects, serve_args, validate_strict
from tests.support.prometheus import check, exposition, grafana_interpolate, grafana_variables

MONITORING = DEPLOY / "monitoring"
DASHBOARD = MONITORING / "modelinit-dashboard.json"
OPERATOR_API = "monitoring.coreos.com/v1"
# Labels a Kubernetes scrape puts on every series (PodMonitor, or the common `kubernetes-pods` job).
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance", "service"}
METHODS = {m.name for m in modelinit_pb2.DESCRIPTOR.services_by_name["ModelInit"].methods}
LABEL_VALUES = {"code": {c.name for c in grpc.StatusCode}, "method": METHODS, "reason": set(REJECT_REASONS)}
RANGE_FUNCTIONS_ON_COUNTERS = {"rate", "irate", "increase", "resets"}
# Fields of the prometheus-operator CRDs (monitoring.coreos.com/v1) that these files may use.
RULE_GROUP_FIELDS = {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"}
RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
POD_ENDPOINT_FIELDS = {"port", "portNumber", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
                       "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings", "tlsConfig",
                       "bearerTokenSecret", "basicAuth", "authorization", "oauth2", "followRedirects",
                       "enableHttp2", "filterRunning", "proxyUrl", "trackTimestampsStaleness"}


# --- what is rendered -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return kustomize(MONITORING)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def alerts(objects: list[dict]) -> list[dict]:
    return [r for g in one(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return out


def dashboard_exprs(dashboard: dict) -> dict[str, str]:
    """'panel title / refId' -> the expression Grafana sends to Prometheus."""
    variables = grafana_variables(dashboard)
    return {f"{p['title']} / {t['refId']}": grafana_interpolate(t["expr"], variables)
            for p in panels(dashboard) for t in p.get("targets", [])}


@pytest.fixture(scope="module")
def exprs(objects, dashboard) -> dict[str, str]:
    found = {f"alert {r['alert']}": r["expr"] for r in alerts(objects)}
    found.update(dashboard_exprs(dashboard))
    return found


@pytest.fixture(scope="module")
def parsed(exprs) -> dict[str, dict]:
    """Each expression as Prometheus' parser and type checker see it."""
    results = check(list(exprs.values()))["exprs"]
    return dict(zip(exprs, results))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The series a real `modelinit serve --metrics-port` exports after a Plan, an Init and a refused Plan."""
    server = ServerProcess("--metrics-port", "0", "--metrics-host", "127.0.0.1")
    try:
        port = re.search(r"metrics on :(\d+)/metrics", server.ready_line).group(1)
        with modelinit.Client(server.target) as c:
            c.init_model(TINY["gpt2"], seed=1, out_dir=tmp_path_factory.mktemp("out"))
            with pytest.raises(ModelInitError):
                c.plan("gpt2", dtype="float64")

        def page() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT).read().decode()

        # a call is counted when its handler returns, just after the client has its status
        wait_until(lambda: 'code="INVALID_ARGUMENT"' in page(), what="the refused Plan's count")
        return exposition(page())
    finally:
        server.stop()


# --- Kubernetes objects -----------------------------------------------------------------------

def test_kustomize_renders_the_monitoring_objects(objects, dashboard):
    assert sorted(o["kind"] for o in objects) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    cm = one(objects, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", "Grafana's dashboard sidecar finds ConfigMaps by this label"
    assert json.loads(cm["data"][DASHBOARD.name]) == dashboard
    assert cm["metadata"]["namespace"] == "monitoring"
    for o in objects:
        if o["kind"] != "ConfigMap":
            assert o["apiVersion"] == OPERATOR_API


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_configmap_validates_against_kubernetes_schema(objects, version):
    validate_strict(one(objects, "ConfigMap"), version)


@pytest.mark.slow
def test_operator_objects_validate_against_the_crd_schemas(objects):
    crs = [o for o in objects if o["apiVersion"] == OPERATOR_API]
    for result in check(objects=crs)["objects"]:
        assert result["errors"] == [], f"{result['kind']}/{result['name']}: {result['errors']}"
    # The generated validators let unknown fields through (the API server would prune them): typos here.
    rule = one(objects, "PrometheusRule")
    assert set(rule["spec"]) == {"groups"}
    for group in rule["spec"]["groups"]:
        assert set(group) <= RULE_GROUP_FIELDS, f"group {group['name']}: unknown fields {set(group) - RULE_GROUP_FIELDS}"
        for r in group["rules"]:
            assert set(r) <= RULE_FIELDS, f"rule {r.get('alert')}: unknown fields {set(r) - RULE_FIELDS}"
    pm = one(objects, "PodMonitor")
    assert set(pm["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
    for ep in pm["spec"]["podMetricsEndpoints"]:
        assert set(ep) <= POD_ENDPOINT_FIELDS, f"unknown endpoint fields {set(ep) - POD_ENDPOINT_FIELDS}"


def test_the_checkers_refuse_bad_input(objects):
    """The tools are not vacuous: a bad duration and a missing expr fail the CRD schema; a
    truncated expression, a gauge where rate() wants a range, and a wrong arity fail the parser."""
    rule = json.loads(json.dumps(one(objects, "PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "10 minutes"
    del rule["spec"]["groups"][0]["rules"][1]["expr"]
    pm = json.loads(json.dumps(one(objects, "PodMonitor")))
    del pm["spec"]["selector"]
    result = check(["sum by (namespace) (rate(modelinit_stream_bytes_total[5m])) by",
                    "rate(modelinit_inflight_streams)", "histogram_quantile(0.99)"], [rule, pm])
    truncated, no_range, arity = result["exprs"]
    assert truncated["syntax_errors"]
    assert any("expected type matrix" in d for d in no_range["diagnostics"])
    assert any("expected 2 argument" in d for d in arity["diagnostics"])
    bad_rule, bad_pm = result["objects"]
    assert any("/for must match pattern" in e for e in bad_rule["errors"])
    assert any("required property expr" in e for e in bad_rule["errors"])
    assert any("required property selector" in e for e in bad_pm["errors"])


def test_podmonitor_scrapes_the_server_pods(objects):
    pm = one(objects, "PodMonitor")
    for overlay in ("cpu", "gpu"):
        dep, c, _, _, cfg = serve_args(kustomize(K8S / "overlays" / overlay))
        assert pm["metadata"]["namespace"] == dep["metadata"]["namespace"]
        assert selects(pm["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        assert ports[ep["port"]] == cfg.metrics_port
        assert ep["path"] == dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    # The NetworkPolicy admits the metrics port from the namespace `monitoring`, where the dashboard goes.
    np = one(kustomize(K8S / "overlays" / "cpu"), "NetworkPolicy")
    sources = {r["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for r in np["spec"]["ingress"]}
    assert one(objects, "ConfigMap")["metadata"]["namespace"] in sources


# --- PromQL -----------------------------------------------------------------------------------

def test_every_expression_parses_and_type_checks(parsed):
    assert len(parsed) >= 10
    problems = []
    for where, r in parsed.items():
        errors = r["syntax_errors"] + r["diagnostics"] + ([] if r["complete"] else ["not parsed to the end"])
        if errors:
            problems.append(f"{where}: {r['expr']!r}: {errors}")
        elif r["type"] != "vector":
            problems.append(f"{where}: an alert or a panel needs an instant vector, got {r['type']}")
    assert not problems, "\n".join(problems)


def test_every_selected_metric_is_exported_by_the_server(parsed, exported):
    problems = []
    used_families = set()
    for where, r in parsed.items():
        selected_labels: set[str] = set()
        for sel in r["selectors"]:
            series = exported.get(sel["metric"])
            if series is None:
                problems.append(f"{where}: {sel['metric']} is not exported by the server")
                continue
            used_families.add(series.family)
            selected_labels |= series.labels
            for m in sel["matchers"]:
                if m["name"] not in series.labels | TARGET_LABELS:
                    problems.append(f"{where}: {sel['metric']} has no label {m['name']!r}")
                if m["name"] in LABEL_VALUES and re.fullmatch(r"[\w|]+", m["value"] or ""):
                    unknown = set(m["value"].split("|")) - LABEL_VALUES[m["name"]]
                    if unknown:
                        problems.append(f"{where}: {m['name']} never takes the values {sorted(unknown)}")
            if sel["range_function"] in RANGE_FUNCTIONS_ON_COUNTERS and series.type not in ("counter", "histogram"):
                problems.append(f"{where}: {sel['range_function']}() of {sel['metric']}, a {series.type}")
        for label in r["grouping"]:
            if label not in selected_labels | TARGET_LABELS:
                problems.append(f"{where}: groups by {label!r}, which none of its series carries")
    assert not problems, "\n".join(problems)


def test_the_dashboard_shows_every_exported_family(dashboard, exported):
    families = {s.family for s in exported.values() if not s.family.endswith("_created")}
    parsed = check(list(dashboard_exprs(dashboard).values()))["exprs"]
    shown = {exported[sel["metric"]].family for r in parsed for sel in r["selectors"] if sel["metric"] in exported}
    assert families - shown == set(), "exported but on no panel"


# --- alerts -----------------------------------------------------------------------------------

def max_streams() -> int:
    cm = one(kustomize(K8S / "overlays" / "cpu"), "ConfigMap", "modelinit-serve")
    return int(cm["data"]["max-streams"])


def monitoring_docs() -> str:
    text = (REPO / "docs" / "deploy.md").read_text()
    m = re.search(r"^## Monitoring\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "docs/deploy.md has no '## Monitoring' section"
    return m.group(1)


def test_alerts_are_complete_and_documented(objects):
    rules = alerts(objects)
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) and len(names) >= 5
    docs = monitoring_docs()
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"].get("summary") and r["annotations"].get("description"), r["alert"]
        assert r.get("for"), f"{r['alert']}: an alert without `for` fires on one bad evaluation"
        assert re.search(rf"`{r['alert']}`", docs), f"{r['alert']} is not described in docs/deploy.md's Monitoring section"
    assert "modelinit-dashboard.json" in docs


def test_max_streams_matches_the_configmap(objects, dashboard):
    limit = max_streams()
    (near,) = [r for r in alerts(objects) if r["alert"] == "ModelinitStreamsNearLimit"]
    assert re.search(rf"\*\s*{limit}\s*\)", near["expr"]), f"the alert's max-streams is not the ConfigMap's {limit}"
    assert grafana_variables(dashboard)["max_streams"] == str(limit)


# --- the dashboard ----------------------------------------------------------------------------

def test_dashboard_structure(dashboard):
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    # The namespace variable's query is label_values(SELECTOR, LABEL): the selector must parse too.
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variables["namespace"]["query"]["query"])
    assert m and m.group(2) in TARGET_LABELS
    (sel,) = check([m.group(1)])["exprs"]
    assert not sel["syntax_errors"] and not sel["diagnostics"] and sel["type"] == "vector"

    cells: dict[tuple[int, int], str] = {}
    ids = set()
    for p in panels(dashboard):
        assert p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{p['title']}: outside the 24-column grid"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat", "table", "gauge", "bargauge")
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and p.get("description"), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip()
