"""A mesh whose hosts are network namespaces: every node, the scheduler and NATS in its own.

Real namespaces on 1 Gbit/s tc-shaped links (root; skipped with the reason otherwise):
transport "auto" picks tcp between nodes (different hosts to the data plane), the DE-path
and PE-path turns are token-exact against the reference, the KV crosses the PE node's
link (its eth0 counters grow by at least the bytes its traffic manager pushed), a short
`dualpath bench --up --netns` runs, and stopping the mesh deletes every namespace.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from dualpath.cli import main
from dualpath.netns.fabric import namespaces, probe, run
from tests.integration.exactness import ask, assert_exact
from tests.integration.meshutil import tiny_mesh
from tests.integration.test_mesh_exactness import _turn1

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(probe() is not None, reason=f"network namespaces: {probe()}")]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("netns")
    m = tiny_mesh(tmp, kv_blocks=128, netns=True, link_gbps=1.0, transport="auto",
                  extra={"scheduler": {"liveness-timeout-s": "2", "read-path": "de",
                                        # the second turn must come from the store over the DE path, not
                                        # from the decode buffer it was kept in (pending saves)
                                        "serve-pending-saves": "false"}})
    m.store_root = Path(m.spec.store)
    m.start(timeout=180)
    tag = m.net.fabric.tag
    yield m
    m.stop()
    assert not [ns for ns in namespaces() if ns.startswith(tag)], "namespaces left after stop()"


def tx_bytes(ns: str) -> int:
    doc = json.loads(run(["ip", "-n", ns, "-s", "-j", "link", "show", "eth0"]).stdout)
    return doc[0]["stats64"]["tx"]["bytes"]


def tm_bytes(mesh, engine: str, kind: str) -> float:
    view = httpx.get(mesh.url + "/v1/mesh", timeout=5).json()
    url = next(t["metrics_url"] for t in view["traffic_managers"] if t["engine"] == engine)
    text = httpx.get(url, timeout=5).text  # reached from here over the fabric's uplink
    m = re.search(r'dualpath_traffic_manager_bytes_total\{kind="%s"\} ([0-9.e+]+)' % kind, text)
    return float(m.group(1)) if m else 0.0


def test_every_process_runs_in_its_hosts_namespace(mesh):
    assert mesh.url.startswith("http://198.18.") and mesh.nats_url.startswith("nats://198.18.")
    hosts = mesh.net.fabric.hosts
    assert set(hosts) == {"nats", "sched", "p0", "d1"}
    for proc in mesh.procs:  # nats, scheduler, gateway-p0, prefill-p0-e0, tm-p0-e0, ...
        where = {"nats": "nats", "scheduler": "sched"}.get(proc.name) or proc.name.split("-")[1]
        pids = run(["ip", "netns", "pids", hosts[where].ns]).stdout.split()
        assert str(proc.popen.pid) in pids, (proc.name, where)


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_turns_are_exact_over_tcp_between_namespaces(mesh, reference, mode):
    prompt = _turn1(mesh, reference, f"netns-{mode}")
    pe_ns = mesh.net.fabric.hosts["p0"].ns
    sent0, pushed0 = tx_bytes(pe_ns), tm_bytes(mesh, "p0-e0", "pd_push")
    body = ask(mesh.url, prompt, 24, dualpath_mode=mode)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
    assert_exact(body, reference, prompt, what=f"netns {mode}")
    pushed = tm_bytes(mesh, "p0-e0", "pd_push") - pushed0
    assert pushed > 0 and tx_bytes(pe_ns) - sent0 >= pushed  # the KV went out on the PE node's link
    if mode == "dualpath":  # read-path de: the hits were pulled from the DE buffer across the link
        assert tm_bytes(mesh, "p0-e0", "de_path_pull") > 0


def test_a_dualpath_bench_runs_across_namespaces(tmp_path):
    rc = main(["bench", "--up", "--netns", "--link-gbps", "1", "--model", "tiny", "--kv-blocks", "128",
               "--buffer-mb", "16", "--trace", "gen:32k", "--agents", "2", "--scale", "0.05", "--max-turns", "3",
               "--offline", "--modes", "dualpath", "--no-probe", "--json", str(tmp_path / "b.json"),
               "--no-progress"])
    assert rc == 0
    runs = json.loads((tmp_path / "b.json").read_text())["runs"]
    assert runs[0]["mode"] == "dualpath" and runs[0]["turns"] == 6 and runs[0]["errors"] == 0
