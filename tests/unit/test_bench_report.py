"""Bench reports: medians over repeats with their spread, every bound term, the online levels with
the SLO term that failed, JSON without NaN, PNG plots."""
import json

import pytest

from dualpath.bench.metrics import summary
from dualpath.bench.report import clean, markdown, node_label, node_roles, storage_figure, write_json, write_report
from dualpath.bench.scrape import parse_metrics

pytestmark = pytest.mark.unit
TERMS = {"storage_read_s": 4.0, "storage_write_s": 0.5, "prefill_s": 1.0, "decode_s": 0.8, "engines_cores_s": 0.9,
         "cpu_s": 1.2, "data_plane_s": 0.01, "serial_s": None}


def _run(mode, kind="offline", aps=None, jct=12.0, bound=4.0, repeat=0):
    return {"mode": mode, "kind": kind, "aps": aps, "repeat": repeat, "turns": 10, "errors": 0,
            "jct_s": jct if kind == "offline" else None, "hit_ratio": 0.9, "ttft_p50_s": 0.2, "ttft_p99_s": 0.5,
            "ttst_p50_s": 0.25, "tpot_p50_s": 0.02, "tpot_p99_s": float("nan"), "slo_attainment": 0.95,
            "slo": {"ttft_s": 4.0, "tpot_s": 0.05, "target": 0.9, "warmup": 0.2},
            "ttft_steady_mean_s": 0.3, "tpot_steady_mean_s": 0.02, "slo_holds": True, "slo_failed": "",
            "storage_read_bytes_per_node": {"p0": 3e6, "d1": 1e6},
            "storage_series": {"p0": [[0, 0], [1, 2e6], [2, 3e6]], "d1": [[0, 0], [2, 1e6]]},
            "jct_lower_bound_s": bound if kind == "offline" else None,
            "jct_over_bound": jct / bound if kind == "offline" else None,
            "bound": {**TERMS, "storage_read_s": bound, "bound_s": bound, "limit": "storage_read_s",
                      "reading_nodes": 2} if kind == "offline" else None}


def _doc(runs, repeat=1, **kw):
    return clean({"trace": "gen:32k", "config": {"model": "tiny", "repeat": repeat}, "runs": runs,
                  "summary": summary(runs), **kw})


def test_offline_report_prints_medians_spread_every_term_and_the_ratios():
    runs = [_run("basic", jct=j, bound=4.0, repeat=k) for k, j in enumerate((12.0, 10.0, 14.0))]
    runs += [_run("dualpath", jct=j, bound=2.0, repeat=k) for k, j in enumerate((6.0, 5.0, 8.0))]
    runs += [_run("oracle", jct=j, bound=1.0, repeat=k) for k, j in enumerate((4.0, 4.0, 5.0))]
    text = markdown(_doc(runs, repeat=3))
    assert "medians of 3 runs" in text
    assert "| basic | 12.000 [10.000-14.000] | 4.000 | 3.00x [2.50-3.50] | storage read | n/a | n/a |" in text
    assert "| storage read | storage write | prefill compute | decode compute" in text
    assert "| dualpath | 2.000 | 0.500 | 1.000 | 0.800 | 0.900 | 1.200 | 0.010 | n/a |" in text
    assert "dualpath/basic: speed-up (basic JCT / its JCT) 2.00x [1.75-2.00]" in text
    assert "ratio of the bounds (basic / its) 2.00x" in text and "speed-up / bound ratio 1.00x" in text
    assert "dualpath/oracle: JCT / oracle JCT 1.50x [1.25-1.60]" in text
    assert "storage MB read per node, dualpath (median): d1:1.00 p0:3.00" in text
    assert "hit ratios of the modes lie within 0.000" in text


def test_offline_report_shows_the_simulators_prediction_beside_the_measured_jct():
    runs = [_run("basic", jct=j, repeat=k) for k, j in enumerate((12.0, 10.0))]
    for r, pred in zip(runs, (10.0, 10.0)):
        r.update(predicted_jct_s=pred, measured_over_predicted=r["jct_s"] / pred)
    rates = {"prefill_tok_s": 2000.0, "turn_overhead_s": 0.02, "decode_step_s": 0.01, "decode_per_seq_s": 0.001,
             "kv_bytes_per_token": 2048.0, "snic_bytes_s": 2.1e7, "data_plane_bytes_s": 3e9, "alpha_tokens": 1,
             "beta_tokens": 2}
    text = markdown(_doc(runs, repeat=2, prediction={"rates": rates}))
    assert "| basic | 11.000 [10.000-12.000] | 4.000 | 2.75x [2.50-3.00] | storage read | 10.000 | 1.10x [1.00-1.20] |" \
        in text
    assert "- probed: prefill 2000 tok/s + 20 ms a turn; decode step 10.0 ms" in text


def test_offline_report_gives_each_repeats_slowdowns_and_the_probes_alone_beside_measured_over_predicted():
    runs = [_run("basic", jct=j, repeat=k) for k, j in enumerate((12.0, 10.0))]
    for r, pred, alone in zip(runs, (10.0, 12.5), (8.0, 8.0)):
        r.update(predicted_jct_s=pred, measured_over_predicted=r["jct_s"] / pred, predicted_probe_only_jct_s=alone,
                 measured_over_probe_only=r["jct_s"] / alone)
    rates = {"prefill_tok_s": 2000.0, "turn_overhead_s": 0.02, "decode_step_s": 0.01, "decode_per_seq_s": 0.001,
             "kv_bytes_per_token": 2048.0, "snic_bytes_s": 2.1e7, "data_plane_bytes_s": 3e9, "alpha_tokens": 1,
             "beta_tokens": 2, "corun_prefill_slow": 1.1, "corun_decode_slow": 1.0}
    pred = {"rates": rates, "probe": {"corun_prefill_slow": 1.1, "corun_decode_slow": 1.0},
            "corun_by_repeat": {"1": [1.6, 1.45], "0": [1.5, 1.2]}}
    text = markdown(_doc(runs, repeat=2, prediction=pred))
    assert "| measured/predicted | measured/predicted, the probe's co-run alone |" in text
    assert "| 11.250 [10.000-12.500] | 1.00x [0.80-1.20] | 1.38x [1.25-1.50] |" in text
    assert "take 1.10x / 1.00x their time alone as probed" in text
    assert "oracle runs of the OTHER repeats computed (one repeat: the probe's alone): repeat 0 1.50x / 1.20x, " \
           "repeat 1 1.60x / 1.45x" in text
    assert "raised to what the oracle runs' engines computed where more" not in text  # an older report's wording


def test_online_report_has_levels_the_failed_term_and_the_capacity_ratio():
    runs = [_run("dualpath", "online", 0.5), _run("dualpath", "online", 1.0), _run("basic", "online", 0.5)]
    runs[1].update(slo_holds=False, slo_failed="tpot")
    spread = {"median": 0.3, "min": 0.2, "max": 0.4, "n": 2}
    search = {"dualpath": {"capacity_aps": 0.5, "bracket": [0.5, 0.55], "levels": [
        {"aps": 0.5, "holds": True, "failed": "", "turns": 96, "ttft_mean_s": spread, "tpot_mean_s": spread,
         "attainment": spread},
        {"aps": 0.55, "holds": False, "failed": "tpot", "turns": 96, "ttft_mean_s": spread, "tpot_mean_s": spread,
         "attainment": spread}]},
        "basic": {"capacity_aps": 0.25, "bracket": [0.25, 0.27], "levels": []}}
    text = markdown(_doc(runs, search=search))
    assert "steady mean TTFT <= 4.0 s and TPOT <= 50 ms" in text
    assert "| dualpath | 1.000 | 0 | 10 | 0.300 | 0.500 | 20.0 | n/a | 95.0% | no | tpot |" in text
    assert "- dualpath: 0.500 APS (next level that failed: 0.550 APS)" in text
    assert "@0.55: fails (tpot), 96 turns, TTFT mean 0.300 [0.200-0.400] s" in text
    assert "- dualpath / basic capacity: 2.00x" in text


def test_json_has_no_nan_and_round_trips(tmp_path):
    doc = _doc([_run("oracle")])
    write_json(doc, tmp_path / "x" / "b.json")
    back = json.loads((tmp_path / "x" / "b.json").read_text())
    assert back["runs"][0]["tpot_p99_s"] is None and back["runs"][0]["mode"] == "oracle"


def test_write_report_writes_markdown_json_and_pngs(tmp_path):
    runs = [_run("basic"), _run("dualpath"), _run("basic", "online", 1.0), _run("dualpath", "online", 1.0)]
    text = write_report(_doc(runs), tmp_path)
    for name in ("report.md", "report.json", "jct_by_mode.png", "ttft_tpot_vs_aps.png", "storage_read_bytes.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "jct_by_mode.png").read_bytes()[:4] == b"\x89PNG"
    assert "![jct_by_mode](jct_by_mode.png)" in text


def test_the_storage_plot_puts_every_mode_on_one_y_axis_and_names_each_nodes_role():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [_run("basic"), _run("dualpath"), _run("oracle")]
    runs[1]["storage_series"] = {"p0": [[0, 0], [1, 7e7]], "d1": [[0, 0], [1, 3e7]]}
    runs[2]["storage_series"] = {"p0": [[0, 0], [1, 0]], "d1": [[0, 0], [1, 0]]}  # oracle reads nothing
    fig = storage_figure(_doc(runs, config={"model": "tiny", "node_roles": {"p0": "prefill", "d1": "decode"}}), plt)
    try:
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == ["basic", "dualpath", "oracle"]
        assert all(axes[0].get_shared_y_axes().joined(axes[0], ax) for ax in axes[1:])
        assert {ax.get_ylim() for ax in axes} == {axes[0].get_ylim()} and axes[0].get_ylim()[0] == 0
        assert axes[0].get_ylim()[1] >= 70  # the largest mode's 70 MB sets every panel's scale
        for ax in axes:
            assert [t.get_text() for t in ax.get_legend().get_texts()] == ["p0 (prefill)", "d1 (decode)"]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("node, roles, label", [
    ("p0", {}, "p0 (prefill)"), ("d12", {}, "d12 (decode)"), ("prefill", {}, "prefill"),
    ("n3", {"n3": "decode"}, "n3 (decode)"), ("n3", {}, "n3"), ("p0", {"p0": "decode"}, "p0 (decode)")])
def test_a_node_is_labelled_with_its_role_from_the_mesh_or_else_its_name(node, roles, label):
    assert node_label(node, roles) == label


def test_node_roles_come_from_the_meshs_engines():
    mesh = {"engines": [{"node": "p0", "role": "prefill"}, {"node": "p0", "role": "prefill"},
                        {"node": "d1", "role": "decode"}, {"role": "decode"}]}
    assert node_roles(mesh) == {"p0": "prefill", "d1": "decode"}


def test_parse_metrics_reads_bytes_per_node_and_blocks():
    text = ('# HELP x\ndualpath_storage_gateway_read_bytes_total{node="p0"} 1.5e+06\n'
            'dualpath_storage_gateway_read_bytes_total{node="d1"} 42.0\n'
            'dualpath_storage_gateway_blocks_total{outcome="read"} 12.0\n'
            'dualpath_storage_gateway_blocks_total{outcome="written"} 99.0\n')
    by_node, blocks = parse_metrics(text)
    assert by_node == {"p0": 1.5e6, "d1": 42.0} and blocks == 12.0
