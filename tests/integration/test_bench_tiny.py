"""A short real `dualpath bench` against a tiny mesh with a storage cap: all four modes, repeated,
with every term of the bound; an online run with the SLO verdict; a capacity search that bisects."""
import json

import pytest

from dualpath.cli import main
from tests.integration.meshutil import running, tiny_mesh

pytestmark = pytest.mark.integration

CAP = {"scheduler": {"liveness-timeout-s": "2"},
       "storage_gateway": {"snic-read-gbps": "0.5", "snic-write-gbps": "0.5"}}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    with running(tiny_mesh(tmp_path_factory.mktemp("bench"), kv_blocks=256, extra=CAP)) as m:
        yield m


def test_offline_bench_writes_json_report_and_plots(mesh, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(["bench", "--url", mesh.url, "--trace", "gen:32k", "--agents", "3", "--scale", "0.05",
               "--max-turns", "6", "--offline", "--snic-gbit", "0.5", "--repeat", "2", "--json",
               str(tmp_path / "b.json"), "--report", str(out), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "b.json").read_text())
    assert [r["mode"] for r in doc["runs"]] == ["basic", "dualpath", "dualpath-split", "oracle",
                                                "dualpath", "dualpath-split", "oracle", "basic"]  # rotated
    for r in doc["runs"]:
        assert r["turns"] == 18 and r["errors"] == 0
        assert r["jct_s"] > 0 and r["jct_lower_bound_s"] > 0
        # every term is physical: no bound above what the run did (the chain is capped by what each
        # turn took; the counters are scraped a moment after the run, so their edges blur a little)
        assert r["jct_s"] >= 0.8 * r["jct_lower_bound_s"]
        assert 0.4 < r["hit_ratio"] <= 1.0  # later turns load earlier turns' blocks (ids fed back)
        assert set(r["storage_read_bytes_per_node"]) == {"p0", "d1"}
        tiers = r["tiers"]  # every turn's prompt tokens split by where their KV came from
        assert tiers["turns_without_tiers"] == 0
        assert sum(tiers[k] for k in ("computed", "engine", "buffer", "storage_pe", "storage_de")) == r["prompt_tokens"]
        assert r["mode"] != "basic" or tiers["storage_de"] == 0
        assert r["mode"] != "oracle" or tiers["storage_pe"] == tiers["storage_de"] == 0
        b = r["bound"]
        assert b["prefill_s"] > 0 and b["decode_s"] > 0 and b["cpu_s"] > 0 and b["serial_s"] > 0
        if r["mode"] != "oracle":
            assert b["storage_read_s"] > 0 and b["storage_write_s"] > 0 and b["data_plane_s"] > 0
    runs = {r["mode"]: r for r in doc["runs"]}
    assert runs["dualpath"]["bound"]["reading_nodes"] == 2 and runs["basic"]["bound"]["reading_nodes"] == 1
    summ = doc["summary"]
    assert summ["offline"]["basic"]["jct_s"]["n"] == 2 and "dualpath-split/basic" in summ["pairs"]
    assert summ["hit_ratio_spread"] <= 0.02  # every prompt is stored: the modes hit alike
    for name in ("report.md", "report.json", "jct_by_mode.png", "storage_read_bytes.png"):
        assert (out / name).stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| dualpath |" in printed and "Lower bound" in printed and "medians of 2 runs" in printed


def test_online_bench_reports_latency_and_slo(mesh, tmp_path):
    rc = main(["bench", "--url", mesh.url, "--trace", "gen:32k", "--agents", "3", "--scale", "0.05",
               "--max-turns", "4", "--aps", "2", "--modes", "dualpath,basic", "--slo-ttft", "600",
               "--slo-tpot", "60", "--no-probe", "--json", str(tmp_path / "o.json"), "--no-progress"])
    assert rc == 0
    runs = json.loads((tmp_path / "o.json").read_text())["runs"]
    assert [r["mode"] for r in runs] == ["dualpath", "basic"]
    for r in runs:
        assert r["kind"] == "online" and r["aps"] == 2 and r["turns"] == 12
        assert 0 < r["ttft_p50_s"] <= r["ttft_p99_s"]
        # SLOs no finished turn can miss (longer than the test may run): attainment counts every turn
        assert r["tpot_p50_s"] > 0 and r["slo_attainment"] == 1.0
        assert r["slo_holds"] and r["slo_failed"] == "" and r["ttft_steady_mean_s"] > 0
        assert r["jct_lower_bound_s"] is None


def test_capacity_search_bisects_and_names_what_failed(mesh, tmp_path):
    # a TPOT limit no turn can meet: every level fails on TPOT, the search walks down from its start
    rc = main(["bench", "--url", mesh.url, "--trace", "gen:32k", "--agents", "2", "--scale", "0.05",
               "--max-turns", "2", "--search-aps", "--modes", "dualpath", "--aps-start", "4", "--search-steps", "2",
               "--min-turns", "6", "--slo-ttft", "600", "--slo-tpot", "0.000001", "--no-probe",
               "--json", str(tmp_path / "s.json"), "--no-progress"])
    assert rc == 0
    doc = json.loads((tmp_path / "s.json").read_text())
    s = doc["search"]["dualpath"]
    assert s["capacity_aps"] == 0 and [lv["aps"] for lv in s["levels"]] == [4, 2]
    assert all(lv["failed"] == "tpot" and lv["turns"] >= 6 for lv in s["levels"])
