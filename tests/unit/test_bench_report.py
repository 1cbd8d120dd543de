"""Bench reports: markdown with the bound beside JCT, JSON without NaN, PNG plots."""
import json

import pytest

from dualpath.bench.report import clean, markdown, ratios, write_json, write_report
from dualpath.bench.scrape import parse_metrics

pytestmark = pytest.mark.unit


def _run(mode, kind="offline", aps=None, jct=12.0, bound=4.0):
    return {"mode": mode, "kind": kind, "aps": aps, "turns": 10, "errors": 0, "jct_s": jct if kind == "offline" else None,
            "hit_ratio": 0.9, "ttft_p50_s": 0.2, "ttft_p99_s": 0.5, "ttst_p50_s": 0.25, "tpot_p50_s": 0.02,
            "tpot_p99_s": float("nan"), "slo_attainment": 0.95, "slo": {"ttft_s": 4.0, "tpot_s": 0.05, "target": 0.9},
            "storage_read_bytes_per_node": {"p0": 3e6, "d1": 1e6},
            "storage_series": {"p0": [[0, 0], [1, 2e6], [2, 3e6]], "d1": [[0, 0], [2, 1e6]]},
            "jct_lower_bound_s": bound if kind == "offline" else None,
            "bound": {"storage_s": bound, "compute_s": 1.0, "serial_s": None, "bound_s": bound, "limit": "storage_s",
                      "reading_nodes": 2}}


def test_offline_report_prints_the_bound_and_the_ratio():
    doc = clean({"trace": "gen:32k", "config": {"model": "tiny"}, "runs": [_run("basic"), _run("dualpath", jct=6.0)]})
    text = markdown(doc)
    assert "| basic | 12.000 | n/a | n/a | 4.000 | 3.00x | storage_s |" in text  # no prediction without a probe
    assert "| dualpath | 6.000 | n/a | n/a | 4.000 | 1.50x |" in text
    assert "d1:1.00 p0:3.00" in text


def test_headline_ratios_of_an_offline_run():
    doc = {"runs": [_run("basic"), _run("dualpath", jct=6.0), _run("oracle", jct=5.0)]}
    doc["ratios"] = r = ratios(doc)
    assert r["dualpath_speedup_over_basic"] == pytest.approx(2.0)
    assert r["dualpath_over_oracle"] == pytest.approx(1.2)
    assert r["dualpath_read_bytes_max_over_avg"] == pytest.approx(3e6 / 2e6)  # p0 3 MB, d1 1 MB
    text = markdown(clean({"trace": "t", **doc}))
    assert "dualpath speed-up over basic (basic JCT / dualpath JCT): 2.00x" in text
    assert "dualpath JCT / oracle JCT: 1.20x" in text
    assert ratios({"runs": [_run("basic")]}) == {}  # nothing to compare


def test_online_report_has_slo_and_search():
    runs = [_run("dualpath", "online", 0.5), _run("dualpath", "online", 1.0), _run("basic", "online", 0.5)]
    text = markdown(clean({"trace": "t", "runs": runs, "search": {"dualpath": 1.0, "basic": 0.5}}))
    assert "SLO TTFT <= 4.0 s, TPOT <= 50 ms" in text
    assert "| dualpath | 0.500 | 0.200 | 0.500 |" in text and "95.0%" in text
    assert "- dualpath: 1.000 APS" in text


def test_json_has_no_nan_and_round_trips(tmp_path):
    doc = clean({"trace": "t", "runs": [_run("oracle")]})
    write_json(doc, tmp_path / "x" / "b.json")
    back = json.loads((tmp_path / "x" / "b.json").read_text())
    assert back["runs"][0]["tpot_p99_s"] is None and back["runs"][0]["mode"] == "oracle"


def test_write_report_writes_markdown_json_and_pngs(tmp_path):
    runs = [_run("basic"), _run("dualpath"), _run("basic", "online", 1.0), _run("dualpath", "online", 1.0)]
    text = write_report(clean({"trace": "t", "runs": runs}), tmp_path)
    for name in ("report.md", "report.json", "jct_by_mode.png", "ttft_tpot_vs_aps.png", "storage_read_bytes.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "jct_by_mode.png").read_bytes()[:4] == b"\x89PNG"
    assert "![jct_by_mode](jct_by_mode.png)" in text


def test_parse_metrics_reads_bytes_per_node_and_blocks():
    text = ('# HELP x\ndualpath_storage_gateway_read_bytes_total{node="p0"} 1.5e+06\n'
            'dualpath_storage_gateway_read_bytes_total{node="d1"} 42.0\n'
            'dualpath_storage_gateway_blocks_total{outcome="read"} 12.0\n'
            'dualpath_storage_gateway_blocks_total{outcome="written"} 99.0\n')
    by_node, blocks = parse_metrics(text)
    assert by_node == {"p0": 1.5e6, "d1": 42.0} and blocks == 12.0
