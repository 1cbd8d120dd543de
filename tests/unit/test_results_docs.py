"""docs/results: pages built from the tools' JSON reports, each with its run record; stale pages and
reports without a date, machine, load average or command are caught (dualpath/results/)."""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dualpath.bench.metrics import summary
from dualpath.results import pages
from dualpath.results.__main__ import main as results_main
from dualpath.results.bench import offline
from dualpath.results.common import ReportError, header
from shared.benchrun import command_line, machine, start

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "results" / "data"
TERMS = re.compile(r"\b(PE|DE|SNIC|CNIC|JCT|TTFT|TPOT|TTST|APS|\d+P\d+D)\b")


def _results(tmp: Path, *names: str) -> Path:
    """A results directory whose data/ holds the named fixture reports (all when none named)."""
    (tmp / "data").mkdir(parents=True)
    for f in sorted(FIXTURES.glob("*.json")):
        if not names or f.stem in names:
            shutil.copy(f, tmp / "data" / f.name)
    return tmp


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    out = _results(tmp_path_factory.mktemp("results"))
    assert pages.write(out) == ["README.md", "bench.md", "chaos.md", "fleet.md", "sim.md"]
    return out


def _section(page: str, name: str) -> str:
    return page.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]


def test_each_report_has_its_date_machine_load_times_and_command(written):
    bench = _section((written / "bench.md").read_text(), "bench-tiny")
    assert "2026-01-15T10:20:30+00:00 · Test CPU @ 2.0GHz, 2 cores, 23.5 GiB · load average 0.30 → 0.80 · " \
           "CPU 95.5 s over 120.0 s wall\n" in bench
    assert "```sh\n.venv/bin/dualpath bench --up --model tiny --snic-gbit 0.1 --trace gen:32k --agents 12 " \
           "--scale 0.06 --max-turns 8 --offline --json docs/results/data/bench-tiny.json\n```" in bench
    assert "not a quiet run" not in bench
    flagged = _section((written / "bench.md").read_text(), "bench-online-tiny")
    assert "load average 2.30 → 1.90 (0.00 beyond its own work)" in flagged
    assert "**not a quiet run**: load average 2.30 at the start (> 1.5)\n" in flagged
    for page in ("sim.md", "fleet.md", "chaos.md"):
        assert (written / page).read_text().count("· load average ") == (2 if page == "sim.md" else 1)


@pytest.mark.parametrize("load,others,flagged,says", [
    ((0.3, 2.1), 0.2, "", "load average 0.30 → 2.10 (0.20 beyond its own work) · CPU"),
    ((0.3, 2.1), 1.8, "load average beyond this run's own work reached 1.80 (> 1.5)", "**not a quiet run**: load "
                                                                                      "average beyond"),
    ((1.6, 0.9), None, None, "**not a quiet run**: load average 1.60 (> 1.5)"),  # a record without a verdict
    ((0.3, 0.9), None, None, "load average 0.30 → 0.90 · CPU"),
])
def test_a_run_above_the_quiet_load_is_flagged(load, others, flagged, says):
    cond = {"date": "d", "machine": {"cpu": "c", "cores": 2, "memory_gib": 1.0}, "load_start": [load[0]],
            "load_end": [load[1]], "command": "dualpath bench", "others_load": others, "flagged": flagged}
    line, _, fence, *_ = header({k: v for k, v in cond.items() if v is not None})
    assert says in line and ("not a quiet run" in line) == ("not a quiet" in says)
    assert fence == "```text"  # not a command to run as written (no .venv/bin/)


def test_the_bench_page_has_each_modes_figures_and_the_plots(written):
    text = (written / "bench.md").read_text()
    bench = _section(text, "bench-tiny")
    assert "| mode | JCT s | bound s | JCT/bound | bound set by | TTFT p50 / p99 s | TPOT p50 / p99 ms | " \
           "storage MB read per node | simulator's JCT s |" in bench
    assert "| basic | 20.40 | 17.00 | 1.20x | storage read | 0.43 / 1.84 | 12.0 / 31.0 | p0 (prefill) 1.50, " \
           "d0 (decode) 0.00 | 19.00 |" in bench
    assert "| oracle | 10.90 | 8.00 | 1.36x | decode compute |" in bench
    assert "| simulator's JCT s | measured/predicted (the probe's co-run alone) |" in bench
    assert "| 10.10 | 1.08x |" in bench  # an older report: no figures at the probe's slowdowns alone
    assert "- dualpath/basic: speed-up 1.67x; ratio of the bounds 1.87x" in bench
    assert "Setup: model tiny, 1P1D, trace gen:32k, 12 agents, scale 0.06, storage NIC 0.1 Gbit/s per node" in bench
    for png in ("jct_by_mode", "storage_read_bytes"):
        assert f"![{png}](img/bench-tiny/{png}.png)" in bench
        assert (written / "img" / "bench-tiny" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    online = _section(text, "bench-online-tiny")
    assert "| basic | 0.500 | 48 | 0.80 / 1.80 | 12.0 / 31.0 | 0.95 | no (ttft) |" in online
    assert "basic 0.250 APS, dualpath 0.500 APS." in online and "Over basic: dualpath 2.00x." in online
    assert "![ttft_tpot_vs_aps](img/bench-online-tiny/ttft_tpot_vs_aps.png)" in online


def test_the_bench_page_gives_the_probes_slowdowns_alone_and_each_repeats():
    rows = [{"mode": "oracle", "kind": "offline", "jct_s": 2.0, "repeat": k, "hit_ratio": 0.9,
             "predicted_jct_s": 2.0 / x, "measured_over_predicted": x, "predicted_probe_only_jct_s": 1.6,
             "measured_over_probe_only": 1.25} for k, x in enumerate((1.02, 1.08))]
    doc = {"runs": rows, "summary": summary(rows), "prediction": {
        "probe": {"corun_prefill_slow": 1.61, "corun_decode_slow": 1.0}, "corun_by_repeat": {"0": [1.6, 1.4],
                                                                                          "1": [1.62, 1.5]}}}
    text = "\n".join(offline(doc))
    assert "| 1.05x (1.25x) |" in text
    assert "the probe's 1.61x / 1.00x; each repeat's prediction raises them to what the other repeats' oracle runs " \
           "computed: repeat 0 1.60x / 1.40x, repeat 1 1.62x / 1.50x." in text


def test_the_bench_page_gives_the_agent_hints_ratios_of_a_hinted_run():
    from dualpath.results.bench import lines
    rows = [{"mode": m, "kind": "offline", "jct_s": 2.0, "repeat": 0, "hit_ratio": 0.9, "hints": h,
             "hinted_turns": n, "hinted_ttft_p50_s": t, "hinted_ttft_p99_s": t, "unhinted_turns": 6 - n,
             "unhinted_ttft_p50_s": 0.02, "unhinted_ttft_p99_s": 0.03}
            for m, h, n, t in (("dualpath", "on", 5, 0.022), ("oracle", "off", 0, None))]
    doc = {"runs": rows, "summary": summary(rows), "hint_ratios": {"dualpath/on: hinted / oracle TTFT p50": 1.1},
           "hint_ratios_each": {"dualpath/on: hinted / oracle TTFT p50": [1.0, 1.1, 1.3]}}
    text = "\n".join(lines(doc))
    assert "## Agent hints (turns after a tool call)" in text and "| dualpath | on | 0 |" in text
    assert "- dualpath/on: hinted / oracle TTFT p50: 1.10x (median of 3: 1.00, 1.10, 1.30)" in text
    plain = [{k: v for k, v in r.items() if "hint" not in k} for r in rows]
    assert "Agent hints" not in "\n".join(lines({"runs": plain, "summary": summary(plain)}))  # not a hints run


def test_the_sim_page_puts_published_beside_simulated_with_the_gap(written):
    text = (written / "sim.md").read_text()
    rep = _section(text, "sim-reproduce-quick")
    assert "| A | JCT speedup dualpath / basic | up to 1.87x | 1.80 | -4% |  |" in rep
    assert "| A | JCT dualpath / oracle | close to 1 | 1.31 | +31% | * |" in rep
    assert "| E | online 44P88D / 2P4D throughput | 22x | n/a |  | * |" in rep
    assert "- A JCT dualpath / oracle: prefill queues: 31% over the oracle" in rep
    assert "![gaps](img/sim-reproduce-quick/gaps.png)" in rep
    plain = _section(text, "sim-2p4d")
    assert "| dualpath | 1000 | 1.80x | 10.00 / 20.00 | 21.0 | 1.10 | 1.030 |" in plain
    assert "![" not in plain


def test_the_fleet_and_chaos_pages_have_their_tables(written):
    fleet = (written / "fleet.md").read_text()
    assert "| engines | req/s want | assign/s | p50 ms | p99 ms |" in fleet
    assert "| 384 | 3.8 | 3.8 | 4.0 | 14.2 |" in fleet and "![assign_ms](img/fleet/assign_ms.png)" in fleet
    chaos = (written / "chaos.md").read_text()
    assert "13 of 14 cells passed." in chaos
    assert "| tm-d | 1/1 | 1/1 | 1/1 | 1/1 | 1/1 | 0/1 |  |  | 2.40 | 3.10 |" in chaos
    assert "- tm-d freeze persist #0: stream hung; plain exact; leaks 1; next request ok" in chaos


def test_the_index_links_every_report_and_says_how_each_is_made(written):
    text = (written / "README.md").read_text()
    assert "[bench-tiny](bench.md#bench-tiny)" in text and "[chaos](chaos.md#chaos)" in text
    assert "No reports yet" not in text
    for name in ("bench-tiny", "bench-smollm2", "sim-reproduce-quick", "fleet", "chaos"):
        assert f"--json docs/results/data/{name}.json" in text


@pytest.mark.parametrize("page", ["README.md", "bench.md", "sim.md", "fleet.md", "chaos.md"])
def test_a_page_links_the_glossary_before_its_first_term(written, page):
    text = (written / page).read_text()
    first = TERMS.search(text)
    assert first is None or text.find("](../../README.md#glossary)") in range(0, first.start()), page


def test_write_then_check_is_current_and_an_edit_or_a_leftover_is_stale(tmp_path):
    out = _results(tmp_path, "sim-2p4d", "chaos")
    assert results_main(["--check", "--dir", str(out)]) == 1  # nothing written yet
    assert results_main(["--write", "--dir", str(out)]) == 0 and pages.stale(out) == []
    (out / "chaos.md").write_text((out / "chaos.md").read_text().replace("13 of 14", "14 of 14"))
    assert pages.stale(out) == [f"{out / 'chaos.md'}: stale"]
    pages.write(out)
    (out / "data" / "chaos.json").unlink()
    assert f"{out / 'chaos.md'}: no report of its kind in data/" in pages.stale(out)
    assert pages.write(out) == ["README.md", "sim.md"] and not (out / "chaos.md").exists()


def test_a_missing_plot_is_stale(tmp_path):
    out = _results(tmp_path, "fleet")
    pages.write(out)
    (out / "img" / "fleet" / "assign_ms.png").unlink()
    assert pages.stale(out) == [f"{out / 'img' / 'fleet' / 'assign_ms.png'}: missing"]


@pytest.mark.parametrize("drop", ["conditions", "date", "machine", "load_start", "load_end", "command",
                                  "machine.cpu"])
def test_a_report_without_its_record_is_refused_naming_the_file_and_the_key(tmp_path, drop, capsys):
    out = _results(tmp_path, "fleet")
    path = out / "data" / "fleet.json"
    doc = json.loads(path.read_text())
    if drop == "conditions":
        del doc["conditions"]
    elif drop == "machine.cpu":
        del doc["conditions"]["machine"]["cpu"]
    else:
        doc["conditions"][drop] = [] if drop.startswith("load") else None
    path.write_text(json.dumps(doc))
    key = '"conditions"' if drop == "conditions" else f'"conditions.{drop}"'
    with pytest.raises(ReportError, match=re.escape(f"{path}: no {key}")):
        pages.reports(out / "data")
    assert results_main(["--check", "--dir", str(out)]) == 2
    assert f"{path}: no {key}" in capsys.readouterr().err


def test_a_report_of_no_known_kind_or_not_json_is_refused(tmp_path):
    out = _results(tmp_path)
    (out / "data" / "speed.json").write_text("{}")
    with pytest.raises(ReportError, match="speed.json: a report's name starts with its kind"):
        pages.reports(out / "data")
    (out / "data" / "speed.json").rename(out / "data" / "fleet-x.json")
    (out / "data" / "fleet-x.json").write_text("{")
    with pytest.raises(ReportError, match="fleet-x.json: not JSON"):
        pages.reports(out / "data")


def test_the_committed_results_pages_are_current():
    assert pages.stale() == [], "run `make results`"
    if not list((pages.RESULTS / "data").glob("*.json")):
        assert "No reports yet" in (pages.RESULTS / "README.md").read_text()


# --- the tools write the record the pages need ------------------------------------------------

def test_the_record_has_the_date_machine_and_the_command_as_typed(monkeypatch):
    rec = start("x").measure().report()
    assert {"date", "machine", "command", "argv", "load_start", "load_end", "cpu_s", "wall_s"} <= set(rec)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", rec["date"])
    m = machine()
    assert m["cpu"] and m["cores"] >= 1 and m["memory_gib"] > 0
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=None))
    assert command_line(["/x/.venv/bin/dualpath", "bench", "--json", "a b.json"]) == \
        ".venv/bin/dualpath bench --json 'a b.json'"
    monkeypatch.setitem(sys.modules, "__main__", SimpleNamespace(__spec__=SimpleNamespace(name="dualpath.bench.fleet")))
    assert command_line(["/x/dualpath/bench/fleet.py", "--engines", "96"]) == \
        ".venv/bin/python -m dualpath.bench.fleet --engines 96"


def _accepted(path: Path) -> dict:
    kind = path.stem.split("-")[0]
    found = pages.reports(path.parent)[kind]
    return found[0][1]


def test_bench_sim_fleet_and_chaos_json_carry_the_record(tmp_path, monkeypatch, capsys):
    from dualpath.bench import chaos, cli, fleet
    from dualpath.cli import main as dualpath
    from dualpath.sim.reproduce import write_json

    doc = json.loads((FIXTURES / "bench-tiny.json").read_text())
    del doc["conditions"]
    for name, run in (
            ("bench", lambda p: cli._output(doc, argparse.Namespace(report=None, json=str(p),
                                                                    conditions=start("dualpath bench")))),
            ("sim", lambda p: dualpath(["sim", "--model", "ds-27b", "--topology", "1P1D", "--trace", "gen:32k:10",
                                        "--agents", "10", "--scale", "0.2", "--modes", "basic", "--no-progress",
                                        "--json", str(p)])),
            ("sim-reproduce", lambda p: write_json(str(p), [["A", "m", "1x", 1.0, 1.0, ""]], [], start("r"))),
            ("fleet", lambda p: _fleet(fleet, monkeypatch, p)),
            ("chaos", lambda p: _chaos(chaos, monkeypatch, p))):
        d = tmp_path / name
        d.mkdir()
        run(d / f"{name}.json")
        assert _accepted(d / f"{name}.json")["conditions"]["machine"]["cores"] >= 1
    capsys.readouterr()


def _fleet(fleet, monkeypatch, path: Path) -> None:
    class Fake:
        def __init__(self, spec):
            self.spec = spec

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        async def run_load(self):
            return {"engines": self.spec.engines, "assign_p50_ms": 1.0, "assign_p99_ms": 2.0}

    monkeypatch.setattr(fleet, "Fleet", Fake)
    monkeypatch.setattr(fleet, "table", lambda rows, columns=None: "")
    assert asyncio.iscoroutinefunction(Fake.run_load)
    assert fleet.main(["--engines", "96", "--json", str(path)]) == 0


def _chaos(chaos, monkeypatch, path: Path) -> None:
    monkeypatch.setattr(chaos, "run", lambda todo, log_dir="": [
        chaos.Cell(c.kind, c.action, c.phase, c.repeat, "exact", "exact", 1.0, 1.0, [], True, True) for c in todo])
    assert chaos.main(["--repeats", "1", "--kinds", "decode", "--json", str(path)]) == 0
