"""One name per service: package, class, Service.name, tracer, logger, subjects, metrics (shared/names.py)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from shared.messages.endpoints import ENDPOINTS, EP
from shared.messages.subjects import Subjects
from shared.metrics import Metrics
from shared.names import SERVICES, hyphenated
from shared.runtime import Service

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def _camel(name: str) -> str:
    return "".join(w.capitalize() for w in name.split("_")) + "Service"


@pytest.mark.parametrize("name", SERVICES)
def test_the_service_class_carries_its_package_name(name):
    app = importlib.import_module(f"services.{name}.app")
    classes = [c for c in vars(app).values() if isinstance(c, type) and issubclass(c, Service)
               and c.__module__ == app.__name__]
    assert [(c.__name__, c.name) for c in classes] == [(_camel(name), name)]


@pytest.mark.parametrize("name", SERVICES)
def test_loggers_and_tracers_of_a_package_are_named_for_it(name):
    src = "\n".join(p.read_text() for p in (ROOT / "services" / name).glob("*.py"))
    loggers = re.findall(r'getLogger\("([^"]+)"\)', src)
    tracers = re.findall(r'get_tracer\("([^"]+)"\)', src)
    assert loggers, name
    assert all(n == name or n.startswith(name + ".") for n in loggers), loggers
    assert all(n == name for n in tracers), tracers


def test_subjects_carry_the_receiving_services_name():
    s = Subjects("ns")
    got = {s.at(EP.PE_WORK, engine="e"), s.at(EP.PE_LOADED, engine="e"), s.at(EP.DE_ADMIT, engine="e"),
           s.at(EP.TM_PUSH, engine="e"), s.at(EP.SG_READ, node="n"), s.at(EP.SG_HIT), s.at(EP.SCHED_OUT, scheduler="i")}
    assert {x.split(".")[1] for x in got} == {"prefill_engine", "decode_engine", "traffic_manager",
                                              "storage_gateway", "scheduler"}
    families = {ep.pattern.split(".")[1] for ep in ENDPOINTS}  # the rest belong to no service (docs/structures.md)
    assert families - set(SERVICES) == {"hb", "cancel", "engine", "fleet", "journal"}


def test_metrics_are_prefixed_by_the_service_name_and_shared_series_by_none():
    m = Metrics("decode_engine")
    assert m.full_name("tokens_total") == "dualpath_decode_engine_tokens_total"
    assert m.full_name("task_failures_total", shared=True) == "dualpath_task_failures_total"


def test_only_the_command_line_and_compose_hyphenate():
    from dualpath.service_cli import SERVICES as CLI

    assert sorted(CLI) == sorted(hyphenated(n) for n in SERVICES)
    compose = (ROOT / "deploy" / "compose" / "docker-compose.yml").read_text()
    for n in ("prefill-engine", "decode-engine", "scheduler"):
        assert re.search(rf"^  {n}:", compose, re.M), n
