"""Real checkers for deploy/monitoring (tests/project/test_monitoring.py), from the npm registry
(pinned in tests/prometheus/package.json, run by tests/prometheus/check.mjs under Node):

- Prometheus' own PromQL parser and type checker: the Lezer grammar of Prometheus' web UI
  (``@prometheus-io/lezer-promql``) and ``@prometheus-io/codemirror-promql``'s ``Parser``, which
  ports the checks of ``promql/parser/parse.go`` (function argument types and counts,
  aggregations, binary operators and vector matching). promtool itself is not on PyPI or npm.
- The prometheus-operator CRDs' OpenAPI schemas, as the validators
  ``@kubernetes-models/prometheus-operator`` generates from them (PrometheusRule, PodMonitor).

:func:`install_checker` runs ``npm ci`` into tests/prometheus/node_modules when it lacks the
packages (once, under a file lock, as the Azurite fixture does) and skips only when ``node`` or
``npm`` is not on PATH. :func:`check` sends expressions and objects to the checker in one Node
process. :func:`grafana_interpolate` replaces Grafana's variables as Grafana does before it
sends a query to Prometheus; :func:`exposition` reads a ``/metrics`` page with prometheus_client's
own parser.
"""
from __future__ import annotations

import fcntl
import json
import pathlib
import re
import shutil
import subprocess
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = pathlib.Path(__file__).resolve().parents[1] / "prometheus"  # tests/prometheus
SCRIPT = HERE / "check.mjs"
PACKAGES = ("@prometheus-io/codemirror-promql", "@prometheus-io/lezer-promql", "@kubernetes-models/prometheus-operator")
INSTALL_TIMEOUT = 600.0
"""How long ``npm ci`` may take (a guard against hanging forever; it takes seconds)."""


def _installed() -> bool:
    return all((HERE / "node_modules" / p / "package.json").is_file() for p in PACKAGES)


def install_checker() -> str:
    """The ``node`` executable, with tests/prometheus/node_modules installed first if needed."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("the monitoring checks run Prometheus' PromQL parser and the prometheus-operator "
                    "schemas under Node: they need node and npm on PATH")
    if _installed():
        return node
    with open(HERE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing it: wait for it
        if not _installed():
            command = "ci" if (HERE / "package-lock.json").exists() else "install"
            done = subprocess.run([npm, command, "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE,
                                  capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
            if done.returncode != 0 or not _installed():
                raise RuntimeError(f"npm {command} in {HERE} failed (exit {done.returncode}): "
                                   f"{(done.stdout + done.stderr)[-3000:]}")
    return node


def check(exprs: list[str] = (), objects: list[dict] = ()) -> dict:
    """What check.mjs says: ``{"exprs": [...], "objects": [...]}``, one entry per input, in order.

    An expression's entry: ``type`` (vector, scalar, matrix, string), ``diagnostics`` (the type
    checker's errors), ``syntax_errors`` (error nodes anywhere in the parse tree), ``complete``
    (the whole text was parsed), ``selectors`` (``metric``, ``matchers`` [{name, op, value}],
    ``range``, ``range_function``), ``grouping`` (by/without/on/ignoring/group_* labels).
    An object's: ``kind``, ``name``, ``errors`` (the CRD schema's complaints)."""
    node = install_checker()
    done = subprocess.run([node, str(SCRIPT)], input=json.dumps({"exprs": list(exprs), "objects": list(objects)}),
                          capture_output=True, text=True, cwd=HERE, timeout=120)
    assert done.returncode == 0, f"check.mjs failed (exit {done.returncode}): {done.stderr[-3000:]}"
    return json.loads(done.stdout)


# --- Grafana --------------------------------------------------------------------------------

# Grafana's built-in variables, with a value of the kind Grafana puts there.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "30s", "__range": "6h", "__range_s": "21600",
                    "__interval_ms": "30000"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")


def grafana_variables(dashboard: dict) -> dict[str, str]:
    """Each template variable's value as Grafana interpolates it into a query: its current (or
    first) value, and the ``allValue`` of a variable that offers All (what it sends when All is
    picked, the default when nothing is)."""
    values = {}
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("includeAll"):
            values[var["name"]] = var.get("allValue") or ".*"
        elif var["type"] == "datasource":
            values[var["name"]] = "prometheus"
        else:
            current = (var.get("current") or {}).get("value")
            options = var.get("options") or []
            values[var["name"]] = str(current if current not in (None, "") else (options[0]["value"] if options else var.get("query", "")))
    return values


def grafana_interpolate(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with every ``$var``, ``${var}``, ``${var:format}`` and ``[[var]]`` replaced; an
    unknown variable is an AssertionError (Grafana would send it to Prometheus as it is)."""
    known = {**GRAFANA_BUILTINS, **variables}

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in known, f"unknown Grafana variable ${name} in {expr!r}"
        return known[name]

    return _VARIABLE.sub(sub, expr)


# --- /metrics ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    family: str
    type: str
    """The family's TYPE: counter, gauge, histogram, ..."""
    labels: frozenset[str]


def exposition(text: str) -> dict[str, Series]:
    """Sample name (``modelinit_requests_total``, ``..._bucket``) -> its family, type and label
    names, from a Prometheus text exposition read by prometheus_client's parser."""
    out: dict[str, Series] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            prev = out.get(sample.name)
            labels = frozenset(sample.labels) | (prev.labels if prev else frozenset())
            out[sample.name] = Series(family.name, family.type, labels)
    return out
