"""deploy/compose/grafana: every panel of the dashboard asks only for series the services export.

The exported series are collected from the code: every `counter`/`gauge`/`histogram` the
services and shared/ define (read with `ast`, each service's under its one name) is registered
in a fresh registry of that service, and the runtime's bus collector is added; the sample
names and labels come from prometheus_client itself. Each panel's PromQL may name only those
series, group and match only by their labels (or the scrape's), and show only grouped labels.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared.metrics import Metrics
from shared.names import SERVICES

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "compose" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "dualpath.json"
KINDS = ("counter", "gauge", "histogram")
ENGINES = ("prefill_engine", "decode_engine")  # shared/engine/: what both engine services register
SCRAPE_LABELS = {"instance", "job"}  # Prometheus adds them to every series it scrapes
PROMQL = {"sum", "avg", "min", "max", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without",
          "ignoring", "on", "group_left", "group_right", "topk", "bottomk", "clamp_min", "clamp_max", "abs"}


def _labels(call: ast.Call) -> tuple[str, ...]:
    arg = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "labels"), None)
    return tuple(ast.literal_eval(arg)) if arg is not None else ()


def definitions() -> list[tuple[tuple[str, ...], str, str, tuple[str, ...], bool]]:
    """(owning services, kind, name, labels, shared) of every series defined under services/ and shared/."""
    out = []
    for path in sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")]):
        parts = path.relative_to(ROOT).parts
        owners = (parts[1],) if parts[0] == "services" else ENGINES if parts[1] == "engine" else ()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in KINDS):
                continue
            first = node.args[0] if node.args else None
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), f"{path}:{node.lineno}: name?"
            shared = any(k.arg == "shared" and ast.literal_eval(k.value) for k in node.keywords)
            assert owners or shared, f"{path}:{node.lineno}: which service registers {first.value}?"
            out.append((owners or tuple(SERVICES), node.func.attr, first.value, _labels(node), shared))
    return out


def exported() -> dict[str, set[str]]:
    """Every sample name the services export -> its label names."""
    from shared.runtime import BusCounters

    registries = {name: Metrics(name) for name in SERVICES}
    for owners, kind, name, labels, shared in definitions():
        for svc in owners:
            try:
                metric = getattr(registries[svc], kind)(name, "doc", labels, shared=shared)
            except ValueError:  # registered already (a shared series, or the same one in two code paths)
                continue
            if labels:
                metric.labels(*labels)  # a child, so that its samples (and their labels) show
    registries["scheduler"].registry.register(BusCounters(SimpleNamespace(bad_messages=0, handler_errors=0)))
    out: dict[str, set[str]] = {}
    for m in registries.values():
        for family in m.registry.collect():
            for sample in family.samples:
                out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    return exported()


def panels() -> list[dict]:
    doc = json.loads(DASHBOARD.read_text())
    flat = []
    for p in doc["panels"]:
        flat += [p, *p.get("panels", [])]
    return [p for p in flat if p["type"] != "row"]


def test_the_census_sees_what_the_services_really_register(series):
    from services.prefill_engine.metrics import PrefillMetrics
    from services.scheduler.metrics import SchedulerMetrics

    for svc, register in (("prefill_engine", lambda m: PrefillMetrics(m, "e0")),
                          ("scheduler", SchedulerMetrics.register)):
        m = Metrics(svc)
        register(m)
        families = {re.sub(r"_(total|created|bucket|count|sum)$", "", n) for n in series}
        for family in m.registry.collect():
            assert family.name in families, family.name
    assert series["dualpath_prefill_engine_prompt_tier_tokens_total"] == {"engine", "tier"}
    assert series["dualpath_scheduler_time_to_first_token_seconds_bucket"] == {"le"}
    for name in ("dualpath_task_failures_total", "dualpath_bus_bad_messages_total",
                 "dualpath_decode_engine_kv_free_blocks", "dualpath_traffic_manager_bytes_total",
                 "dualpath_storage_gateway_read_bytes_total", "dualpath_prefill_engine_compute_seconds_total"):
        assert name in series, name


def _grouped(expr: str) -> set[str]:
    return {lab.strip() for m in re.finditer(r"\b(?:by|without|ignoring|on)\s*\(([^)]*)\)", expr)
            for lab in m.group(1).split(",") if lab.strip()}


def _matched(expr: str) -> set[str]:
    return {m.group(1) for sel in re.finditer(r"\{([^}]*)\}", expr) for m in re.finditer(r"(\w+)\s*(?:=~|!~|!=|=)",
                                                                                            sel.group(1))}


@pytest.mark.parametrize("panel", panels(), ids=lambda p: p["title"])
def test_every_panel_asks_only_for_exported_series_and_their_labels(panel, series):
    assert panel["targets"], "a panel without a query"
    for t in panel["targets"]:
        expr = t["expr"]
        names = set(re.findall(r"\bdualpath_\w+", expr))
        assert names, f"{expr}: no dualpath series"
        unknown = names - set(series)
        assert not unknown, f"{expr}: the services export no {sorted(unknown)}"
        calls = set(re.findall(r"\b([a-z_]+)\s*\(", expr)) - names
        assert calls <= PROMQL, f"{expr}: not PromQL: {sorted(calls - PROMQL)}"
        known = set().union(*(series[n] for n in names)) | SCRAPE_LABELS
        assert _grouped(expr) | _matched(expr) <= known, f"{expr}: labels {sorted((_grouped(expr) | _matched(expr)) - known)}"
        shown = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
        assert shown <= _grouped(expr), f"{t['legendFormat']}: not grouped by {sorted(shown - _grouped(expr))}"


def test_the_dashboard_shows_the_tiers_and_the_key_series():
    exprs = " ".join(t["expr"] for p in panels() for t in p["targets"])
    for name in ("dualpath_prefill_engine_prompt_tier_tokens_total", "dualpath_scheduler_requests_total",
                 "dualpath_scheduler_time_to_first_token_seconds_bucket",
                 "dualpath_scheduler_time_per_output_token_seconds_bucket", "dualpath_scheduler_queue_length",
                 "dualpath_scheduler_requests_running", "dualpath_scheduler_request_resumes_total",
                 "dualpath_storage_gateway_read_bytes_total"):
        assert name in exprs, name
    ids = [p["id"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_the_panels_use_the_provisioned_datasource_and_the_provider_reads_the_mounted_folder():
    yaml = pytest.importorskip("yaml")
    (source,) = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    for p in panels():
        assert p["datasource"]["uid"] == source["uid"], p["title"]
    (provider,) = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "dualpath.yml").read_text())["providers"]
    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "docker-compose.yml").read_text())
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1)[::-1] for v in compose["services"]["grafana"]["volumes"])
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
