"""The bench's figures under `vllm bench serve`'s keys: one recorded run through our figures and
vLLM's (TPOT without the first token, ITL pooled over every gap, goodput counts, percentiles as
numpy's), the flags read as vLLM reads them, and every mode's JSON row carrying the keys."""
import json

import numpy as np
import pytest

from dualpath.bench.metrics import Slo, summarise
from dualpath.bench.replay import RunResult, TurnResult
from dualpath.bench.report import clean, markdown, write_json
from dualpath.bench.vllm_metrics import Spec, parse_goodput, parse_percentiles
from dualpath.cli import CliError, build_parser
from shared.messages.codes import BENCH_MODES

pytestmark = pytest.mark.unit

WALL_S = 1.5
# one recorded run: (start, prompt tokens, generated tokens, arrival of each content chunk, error); s since t0
RECORDED = [
    (0.0, 100, 4, [0.30, 0.35, 0.45, 0.50], ""),
    (0.1, 200, 3, [0.90, 1.00, 1.30], ""),
    (0.2, 50, 1, [0.60], ""),
    (0.5, 120, 6, [0.70, 0.72, 0.74, 0.78, 0.80, 0.85], ""),
    (0.3, 80, 5, [], "HTTP 500: b'overloaded'"),
]
OK = [r for r in RECORDED if not r[4]]
TTFT = [stamps[0] - start for start, _, _, stamps, _ in OK]
E2EL = [stamps[-1] - start for start, _, _, stamps, _ in OK]
TPOT = [(e - f) / (n - 1) for e, f, (_, _, n, _, _) in zip(E2EL, TTFT, OK) if n > 1]
ITL = [b - a for _, _, _, stamps, _ in OK for a, b in zip(stamps, stamps[1:])]
VLLM_KEYS = {"completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput"} | {
    f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")}


def recorded_run(mode: str = "dualpath", kind: str = "offline") -> RunResult:
    turns = [TurnResult(f"j{i}", 0, prompt, gen, start, stamps[0] - start if stamps else float("nan"),
                        stamps[1] - start if len(stamps) > 1 else float("nan"), (stamps or [start + 0.1])[-1] + 0.01,
                        0, err, stamps=stamps) for i, (start, prompt, gen, stamps, err) in enumerate(RECORDED)]
    return RunResult(mode, kind, 1.0 if kind == "online" else None, turns=turns,
                     job_ends={t.job: t.end for t in turns}, wall_s=WALL_S)


def test_our_figures_and_vllms_agree_on_one_recorded_run():
    row = summarise(recorded_run(), Slo(), Spec((50, 90, 99)))
    for q in (50, 90, 99):
        assert row[f"p{q}_ttft_ms"] == pytest.approx(row[f"ttft_p{q}_s"] * 1000)
        assert row[f"p{q}_tpot_ms"] == pytest.approx(row[f"tpot_p{q}_s"] * 1000)
    ours = [t.tpot for t in recorded_run().turns if not t.error and t.gen_tokens > 1]
    assert ours == pytest.approx(TPOT)  # TPOT = (e2el - ttft) / (tokens - 1): the first token left out
    assert TPOT == pytest.approx([0.2 / 3, 0.4 / 2, 0.15 / 5])
    assert row["mean_tpot_ms"] == pytest.approx(np.mean(TPOT) * 1000)
    assert row["mean_itl_ms"] == pytest.approx(75.0)  # 10 gaps summing to 0.75 s: pooled, not per request
    assert row["mean_itl_ms"] != pytest.approx(np.mean([np.mean(x) for x in ([.05, .1, .05], [.1, .3],
                                                                             [.02, .02, .04, .02, .05])]) * 1000)
    assert row["median_e2el_ms"] == pytest.approx(np.median([0.5, 1.2, 0.4, 0.35]) * 1000)


def test_latencies_are_numpys_statistics_in_ms():
    row = summarise(recorded_run(), Slo(), Spec((50, 90, 99.9)))
    for name, xs in (("ttft", TTFT), ("tpot", TPOT), ("itl", ITL), ("e2el", E2EL)):
        assert row[f"mean_{name}_ms"] == pytest.approx(np.mean(xs) * 1000), name
        assert row[f"median_{name}_ms"] == pytest.approx(np.median(xs) * 1000), name
        assert row[f"std_{name}_ms"] == pytest.approx(np.std(xs) * 1000), name
        for p, word in ((50, "50"), (90, "90"), (99.9, "99.9")):
            assert row[f"p{word}_{name}_ms"] == pytest.approx(np.percentile(xs, p) * 1000), (name, p)
    assert "p99_ttft_ms" not in row


def test_counts_and_throughputs_leave_failed_requests_out():
    row = summarise(recorded_run(), Slo())
    assert (row["completed"], row["total_input_tokens"], row["total_output_tokens"]) == (4, 470, 14)
    assert row["duration"] == WALL_S
    assert row["request_throughput"] == pytest.approx(4 / WALL_S)
    assert row["output_throughput"] == pytest.approx(14 / WALL_S)
    assert row["total_token_throughput"] == pytest.approx(484 / WALL_S)
    assert row["request_goodput"] is None  # no --goodput


@pytest.mark.parametrize("slos, good", [
    (["ttft:500", "tpot:100"], 3),  # the 0.8 s TTFT misses; the one-token request counts as TPOT 0
    (["e2el:450"], 2),
    (["ttft:250"], 1),
    (["tpot:50"], 2),  # the one-token request meets it, as in vLLM
])
def test_goodput_counts_the_requests_meeting_every_slo(slos, good):
    row = summarise(recorded_run(), Slo(), Spec(goodput_ms=parse_goodput(slos)))
    assert row["request_goodput"] == pytest.approx(good / WALL_S)


def test_flags_are_read_as_vllm_reads_them():
    assert parse_percentiles("99") == (99.0,)
    assert parse_percentiles("50,90,99.9") == (50.0, 90.0, 99.9)
    assert parse_goodput(["ttft:500", "e2el:2000"]) == (("ttft", 500.0), ("e2el", 2000.0))
    with pytest.raises(ValueError, match="'x'"):
        parse_percentiles("50,x")
    with pytest.raises(ValueError, match="'101'"):
        parse_percentiles("101")


@pytest.mark.parametrize("argv, named", [
    (["--goodput", "itl:5"], "'itl'"), (["--goodput", "ttft:abc"], "'abc'"), (["--goodput", "ttft:-1"], "'-1'"),
    (["--goodput", "ttft"], "'ttft'"), (["--metric-percentiles", "50,nine"], "'nine'"),
])
def test_a_bad_goodput_or_percentile_is_a_cli_error_naming_it(argv, named):
    args = build_parser().parse_args(["bench", "--trace", "gen:32k", "--offline", *argv])
    with pytest.raises(CliError, match=named):
        args.func(args)


@pytest.mark.parametrize("kind", ["offline", "online"])
def test_every_modes_json_row_carries_the_vllm_keys(tmp_path, kind):
    runs = [summarise(recorded_run(m, kind), Slo(), Spec(goodput_ms=(("ttft", 500.0),)))
            | {"repeat": 0, "storage_read_bytes_per_node": {}}
            for m in BENCH_MODES]
    doc = clean({"trace": "gen:32k", "config": {}, "runs": runs})
    write_json(doc, tmp_path / "b.json")
    back = json.loads((tmp_path / "b.json").read_text())
    assert [r["mode"] for r in back["runs"]] == list(BENCH_MODES)
    for r in back["runs"]:
        assert VLLM_KEYS <= set(r), (r["mode"], VLLM_KEYS - set(r))
    text = markdown(doc)
    for section in ("Serving Benchmark Result", "Time to First Token", "Time per Output Token (excl. 1st token)",
                    "Inter-token Latency", "End-to-end Latency", "Request goodput (req/s):", "P99 TPOT (ms):"):
        assert text.count(section) == len(BENCH_MODES), section
