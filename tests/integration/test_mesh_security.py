"""Credentials: API keys on the front door, NATS user/password on the bus, no secret in any log."""
from __future__ import annotations

import httpx
import pytest

from tests.integration.meshutil import tiny_mesh

pytestmark = pytest.mark.integration

API_KEY = "sk-test-7f3a9c1e5b"
NATS_PASSWORD = "nats-pw-41d2e8"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sec")
    m = tiny_mesh(tmp, nats_args=["--user", "mesh", "--pass", NATS_PASSWORD],
                  env={"DUALPATH_NATS_USER": "mesh", "DUALPATH_NATS_PASSWORD": NATS_PASSWORD,
                       "DUALPATH_API_KEYS": f"other-key,{API_KEY}"})
    m.start(timeout=120)  # every service authenticated to NATS, or nothing would be healthy
    yield m
    m.stop()


def _post(mesh, headers):
    return httpx.post(mesh.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0},
                      headers=headers, timeout=30)


def test_requests_without_a_valid_key_get_401_json(mesh):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                    {"Authorization": f"Basic {API_KEY}"}):
        r = _post(mesh, headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(mesh.url + "/v1/models", timeout=10).status_code == 401


def test_a_configured_key_is_accepted_and_health_stays_open(mesh):
    r = _post(mesh, {"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, r.text
    assert httpx.get(mesh.url + "/health", timeout=10).status_code == 200


def test_nats_rejects_a_client_without_credentials(mesh):
    import socket
    from urllib.parse import urlparse

    url = urlparse(mesh.nats_url)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.recv(4096)  # INFO
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        reply = sock.recv(4096).decode()
    assert "Authorization Violation" in reply


def test_no_secret_appears_in_any_log(mesh):
    _post(mesh, {"Authorization": f"Bearer {API_KEY}"})
    for log in mesh.log_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        if log.name == "nats.log":
            continue  # the server's own log (we pass it the password on its command line)
        assert API_KEY not in text and NATS_PASSWORD not in text, log.name
