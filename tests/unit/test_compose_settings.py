"""deploy/compose/dualpath.toml matches the config dataclasses.

The example file lists every setting at its default; it must load for every service
section, hold nothing a service would reject, miss no field, and be exactly what
dualpath/docgen/settings.py renders from the code (so it does not drift).
docs/reference/settings.md is checked in tests/unit/test_reference_docs.py.
"""
from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from dualpath.docgen.settings import render_toml
from services.decode_engine.config import DecodeEngineConfig
from services.prefill_engine.config import PrefillEngineConfig
from services.scheduler.config import SchedulerConfig
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.config import TrafficManagerConfig
from shared.config import load_config
from shared.service_config import CommonConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "compose" / "dualpath.toml"
SECTIONS = {
    "scheduler": SchedulerConfig,
    "prefill_engine": PrefillEngineConfig,
    "decode_engine": DecodeEngineConfig,
    "traffic_manager": TrafficManagerConfig,
    "storage_gateway": StorageGatewayConfig,
}
# Identities with no sensible shared default; validate() insists on them.
REQUIRED = {"traffic_manager": {"engine": "e0"}}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_example_loads_for_every_service_at_the_defaults(section):
    cls = SECTIONS[section]
    required = REQUIRED.get(section, {})
    cfg = load_config(cls, section, file=EXAMPLE, env={}, overrides=required)
    assert cfg == cls(**required)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_example_names_every_setting_once(section):
    data = tomllib.loads(EXAMPLE.read_text())
    common, own = set(data["common"]), set(data[section])
    assert not common & own, f"[{section}] repeats [common] keys {common & own}"
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    assert common | own == fields, f"[{section}]: missing {fields - common - own}, unknown {common | own - fields}"


def test_common_table_holds_only_settings_every_service_has():
    data = tomllib.loads(EXAMPLE.read_text())
    assert set(data["common"]) == {f.name for f in dataclasses.fields(CommonConfig)}
    assert set(data) == {"common", *SECTIONS}


def test_example_is_what_the_generator_renders():
    assert EXAMPLE.read_text() == render_toml(), "stale: run .venv/bin/python -m dualpath.docgen --write"
