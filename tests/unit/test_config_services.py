"""The five services' settings: defaults validate, every field loads from env/TOML, bad values name the key."""
from __future__ import annotations

import dataclasses

import pytest

from services.decode_engine.config import DecodeEngineConfig
from services.prefill_engine.config import PrefillEngineConfig
from services.scheduler.config import SchedulerConfig
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.config import TrafficManagerConfig
from shared.config import ConfigError
from tests.unit.test_config_loading import load, toml

pytestmark = pytest.mark.unit

# --- the real service configs ---------------------------------------------------------------

SERVICES = [
    (SchedulerConfig, "scheduler", {}),
    (PrefillEngineConfig, "prefill_engine", {}),
    (DecodeEngineConfig, "decode_engine", {}),
    (TrafficManagerConfig, "traffic_manager", {"engine": "pe0"}),
    (StorageGatewayConfig, "storage_gateway", {}),
]


@pytest.mark.parametrize("cls,section,needed", SERVICES, ids=[s[1] for s in SERVICES])
def test_service_defaults_load_and_validate(cls, section, needed):
    cfg = load(cls, section, overrides=needed)
    assert isinstance(cfg, cls)


@pytest.mark.parametrize("cls,section,needed", SERVICES, ids=[s[1] for s in SERVICES])
def test_service_config_reads_its_own_table_and_common(tmp_path, cls, section, needed):
    f = toml(tmp_path, f'[common]\nnamespace = "ns1"\n[{section}]\nnode = "n7"\n')
    cfg = load(cls, section, file=f, overrides=needed)
    assert (cfg.namespace, cfg.node) == ("ns1", "n7")


@pytest.mark.parametrize("cls,section,needed", SERVICES, ids=[s[1] for s in SERVICES])
def test_every_service_field_can_be_set_from_env(cls, section, needed):
    # a field whose type the loader cannot coerce would come through as a raw string
    for f in dataclasses.fields(cls):
        default = getattr(cls(), f.name) if f.name != "engine" or cls is not TrafficManagerConfig else "pe0"
        text = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        env = {"DUALPATH_" + f.name.upper(): text.lower() if isinstance(default, bool) else text}
        cfg = load(cls, section, env=env, overrides=needed if f.name not in needed else {})
        assert getattr(cfg, f.name) == default, f.name


BAD = [
    (SchedulerConfig, "scheduler", {}, "http_port", "70000"),
    (SchedulerConfig, "scheduler", {}, "http_port", "-1"),
    (SchedulerConfig, "scheduler", {}, "max_body_bytes", "0"),
    (SchedulerConfig, "scheduler", {}, "liveness_timeout_s", "0"),
    (SchedulerConfig, "scheduler", {}, "read_near_tie", "1"),
    (SchedulerConfig, "scheduler", {}, "read_near_tie", "-0.1"),
    (PrefillEngineConfig, "prefill_engine", {}, "max_batch_tokens", "0"),
    (PrefillEngineConfig, "prefill_engine", {}, "handoff_timeout_s", "-1"),
    (PrefillEngineConfig, "prefill_engine", {}, "kv_blocks", "0"),
    (PrefillEngineConfig, "prefill_engine", {}, "block_size", "12"),
    (PrefillEngineConfig, "prefill_engine", {}, "block_size", "0"),
    (PrefillEngineConfig, "prefill_engine", {}, "dtype", "int8"),
    (PrefillEngineConfig, "prefill_engine", {}, "threads", "-1"),
    (DecodeEngineConfig, "decode_engine", {}, "max_running", "0"),
    (DecodeEngineConfig, "decode_engine", {}, "kv_blocks", "-5"),
    (DecodeEngineConfig, "decode_engine", {}, "dtype", "fp8"),
    (TrafficManagerConfig, "traffic_manager", {}, "engine", ""),
    (TrafficManagerConfig, "traffic_manager", {"engine": "pe0"}, "transport", "carrier-pigeon"),
    (TrafficManagerConfig, "traffic_manager", {"engine": "pe0"}, "buffer_mb", "0"),
    (StorageGatewayConfig, "storage_gateway", {}, "capacity_gb", "-1"),
    (StorageGatewayConfig, "storage_gateway", {}, "io_threads", "0"),
]


@pytest.mark.parametrize("cls,section,needed,key,raw", BAD, ids=[f"{b[1]}-{b[3]}={b[4]}" for b in BAD])
def test_service_validate_rejects_bad_value_naming_the_key(cls, section, needed, key, raw):
    with pytest.raises(ConfigError) as info:
        load(cls, section, overrides={**needed, key: raw})
    assert info.value.key == key
    assert key in str(info.value)


@pytest.mark.parametrize("weights", [("0", "1"), ("1", "0"), ("-1", "5")])
def test_traffic_manager_rejects_non_positive_class_weights(weights):
    with pytest.raises(ConfigError) as info:
        load(TrafficManagerConfig, "traffic_manager",
             overrides={"engine": "pe0", "latency_weight": weights[0], "bulk_weight": weights[1]})
    assert "latency_weight" in info.value.key and "bulk_weight" in info.value.key


@pytest.mark.parametrize("transport", ["auto", "shm", "tcp", "verbs"])
def test_traffic_manager_accepts_every_known_transport(transport):
    cfg = load(TrafficManagerConfig, "traffic_manager", overrides={"engine": "pe0", "transport": transport})
    assert cfg.transport == transport


def test_gateway_rejects_negative_bandwidth_caps():
    caps = [f.name for f in dataclasses.fields(StorageGatewayConfig) if f.name.endswith("gbps")]
    assert caps, "gateway has bandwidth caps"
    for name in caps:
        with pytest.raises(ConfigError) as info:
            load(StorageGatewayConfig, "storage_gateway", overrides={name: "-0.5"})
        assert info.value.key == name


def test_the_scheduler_read_near_tie_setting_reaches_its_pending_reads():
    from services.scheduler.app import SchedulerService
    cfg = load(SchedulerConfig, "scheduler", env={"DUALPATH_READ_NEAR_TIE": "0.25"},
               overrides={"http_port": "0", "model": "tiny"})
    svc = SchedulerService(cfg)
    try:
        assert svc.reads.near_tie == 0.25
    finally:
        svc.http_sock.close()


@pytest.mark.parametrize("port", ["0", "1", "65535"])
def test_scheduler_accepts_edge_ports(port):
    assert load(SchedulerConfig, "scheduler", overrides={"http_port": port}).http_port == int(port)


@pytest.mark.parametrize("size", ["8", "16", "64"])
def test_engine_accepts_block_sizes_that_are_multiples_of_eight(size):
    assert load(DecodeEngineConfig, "decode_engine", overrides={"block_size": size}).block_size == int(size)


def test_unknown_key_in_service_table_is_rejected(tmp_path):
    f = toml(tmp_path, "[scheduler]\nhttp_prot = 1\n")
    with pytest.raises(ConfigError) as info:
        load(SchedulerConfig, "scheduler", file=f)
    assert info.value.key == "scheduler.http_prot"


@pytest.mark.parametrize("bad", [-1, 20])
def test_a_niceness_outside_0_to_19_names_the_key(bad):
    from shared.service_config import check_common

    cfg = load(TrafficManagerConfig, "traffic_manager", overrides={"engine": "pe0", "nice": bad})
    with pytest.raises(ConfigError) as e:
        check_common(cfg)  # every service checks its common settings at start, before it connects
    assert e.value.key == "nice" and "0..19" in str(e.value)


def test_a_mesh_on_one_host_runs_its_traffic_managers_at_niceness_10_and_nothing_else(tmp_path):
    from dualpath.mesh import Mesh, MeshSpec

    started = []
    mesh = Mesh(MeshSpec(model="tiny", port=0, log_dir=str(tmp_path)))
    mesh._service = lambda name, module, flags, **kw: started.append((module, flags.get("nice")))
    mesh.add_node("prefill")
    assert ("traffic_manager", 10) in started
    assert all(nice is None for module, nice in started if module != "traffic_manager"), started
    assert all(cls().nice == 0 for cls, _, _ in SERVICES)  # as a service's own default: as started


@pytest.mark.parametrize("bad", ["-1", "20"])
def test_up_refuses_a_traffic_manager_niceness_outside_0_to_19(bad, capsys):
    from dualpath.cli import main

    with pytest.raises(SystemExit) as e:
        main(["up", "--model", "tiny", "--port", "0", "--tm-nice", bad])
    assert e.value.code == 2
    assert f"--tm-nice {bad}: a niceness, 0..19" in capsys.readouterr().err
