"""What a service checks before it connects: settings every service shares, the `[common]`
table, and listening ports (a taken port is a typed error naming the port and the flag);
the launcher binds the API port itself, so a taken one fails before any process starts."""
from __future__ import annotations

import dataclasses
import socket

import pytest

from dualpath.mesh import Mesh, MeshSpec
from services.storage_gateway.config import StorageGatewayConfig
from shared.config import ConfigError, load_config
from shared.http import PortInUse, adopt_socket, bind_socket
from shared.service_config import CommonConfig, check_common

pytestmark = pytest.mark.unit


@pytest.fixture
def taken():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_common_key_that_not_every_service_has_is_an_error(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text('[common]\nnamespace = "prod"\nmodel = "tiny"\n')
    with pytest.raises(ConfigError) as info:
        load_config(StorageGatewayConfig, "storage_gateway", file=f, env={}, common=CommonConfig)
    assert info.value.key == "common.model" and "not a setting of every service" in str(info.value)


def test_common_keys_every_service_has_apply(tmp_path):
    f = tmp_path / "d.toml"
    f.write_text('[common]\nnamespace = "prod"\nnats_wait_s = 5\n')
    cfg = load_config(StorageGatewayConfig, "storage_gateway", file=f, env={}, common=CommonConfig)
    assert (cfg.namespace, cfg.nats_wait_s) == ("prod", 5.0)


@pytest.mark.parametrize("key,value,why", [
    ("nats_url", "http://x:4222", "not a NATS URL"),
    ("nats_url", "nats://a:4222,nats://:99", "not a NATS URL"),
    ("nats_url", "nats://a:notaport", "not a NATS URL"),
    ("log_level", "loud", "debug | info"),
    ("metrics_port", 70000, "not a port"),
    ("heartbeat_s", 0.0, "> 0"),
    ("nats_wait_s", -1.0, ">= 0"),
    ("nats_creds", "/no/such/file.creds", "no such file"),
])
def test_bad_common_settings_are_refused_naming_the_key(key, value, why):
    with pytest.raises(ConfigError) as info:
        check_common(dataclasses.replace(CommonConfig(), **{key: value}))
    assert info.value.key == key and why in str(info.value)


def test_good_common_settings_pass():
    check_common(CommonConfig(nats_url="nats://n1:4222,nats://n2:4222,tls://n3:4443", log_level="DEBUG",
                              nats_wait_s=0))


def test_a_taken_port_is_a_typed_error_naming_port_and_flag(taken):
    with pytest.raises(PortInUse) as info:
        bind_socket("127.0.0.1", taken, "metrics_port")
    exc = info.value
    assert (exc.host, exc.port, exc.setting) == ("127.0.0.1", taken, "metrics_port")
    assert str(exc) == f"port {taken} on 127.0.0.1 is in use; pick another with --metrics-port"


def test_an_inherited_listener_is_adopted_and_anything_else_refused():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        dup = adopt_socket(listener.dup().detach())
        assert dup.getsockname() == listener.getsockname()
        dup.close()
    with socket.socket() as idle:  # bound, not listening
        idle.bind(("127.0.0.1", 0))
        with pytest.raises(OSError, match="not a listening socket"):
            adopt_socket(idle.fileno())


def test_the_launcher_fails_on_a_taken_api_port_before_starting_anything(taken, tmp_path):
    mesh = Mesh(MeshSpec(model="tiny", port=taken))
    logs = mesh.log_dir
    with pytest.raises(PortInUse) as info:
        mesh.start()
    assert info.value.setting == "port" and "pick another with --port" in str(info.value)
    assert mesh.procs == []
    assert not logs.exists()  # its temporary log directory went with it


def test_the_launcher_owns_the_api_port_it_reports():
    mesh = Mesh(MeshSpec(model="tiny", port=0, log_dir=""))
    try:
        url = mesh.bind_http()
        port = int(url.rsplit(":", 1)[1])
        assert port > 0 and mesh.url == url
        with pytest.raises(PortInUse):  # held: nobody else can take it before the scheduler serves it
            bind_socket("127.0.0.1", port)
    finally:
        mesh.stop()
    assert not mesh.log_dir.exists()
