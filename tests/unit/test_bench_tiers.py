"""The bench's prompt-token tiers: each run sums its successful turns' `dualpath_tiers`, says how
many turns had none, and the report prints every tier's tokens and share per run."""
import pytest

from dualpath.bench.metrics import Slo, summarise
from dualpath.bench.replay import RunResult, TurnResult
from dualpath.bench.report import markdown
from dualpath.bench.tiers import markdown as tier_lines
from dualpath.bench.tiers import sums
from tests.unit.test_bench_report import _doc, _run

pytestmark = pytest.mark.unit


def turn(i: int, tiers: dict, err: str = "") -> TurnResult:
    prompt = sum(tiers.values()) or 100
    return TurnResult("j", i, prompt, 4, 0.0, 0.1, 0.15, 1.0, prompt - tiers.get("computed", prompt), err, tiers=tiers)


def test_a_runs_tiers_are_the_sums_of_its_successful_turns():
    run = RunResult("dualpath-split", "offline", None, turns=[
        turn(0, {"computed": 100, "engine": 0, "buffer": 0, "storage_pe": 0, "storage_de": 0}),
        turn(1, {"computed": 20, "engine": 0, "buffer": 0, "storage_pe": 64, "storage_de": 64}),
        turn(2, {"computed": 5, "engine": 0, "buffer": 128, "storage_pe": 0, "storage_de": 0}),
        turn(3, {"computed": 9, "storage_pe": 999}, err="HTTP 500"),  # failed: not counted
        turn(4, {}),  # no split in its usage
    ], job_ends={"j": 1.0})
    got = summarise(run, Slo())["tiers"]
    assert got == {"computed": 125, "engine": 0, "buffer": 128, "storage_pe": 64, "storage_de": 64,
                   "turns_without_tiers": 1}
    assert sum(v for k, v in got.items() if k != "turns_without_tiers") == sum(
        t.prompt_tokens for t in run.turns[:3])  # the tiers cover every prompt token of the turns that had them


def test_the_report_prints_each_tiers_tokens_and_share():
    tiers = sums([turn(0, {"computed": 25, "engine": 75, "buffer": 0, "storage_pe": 0, "storage_de": 0})])
    lines = tier_lines({"runs": [{"mode": "oracle", "kind": "online", "aps": 0.5, "repeat": 1, "tiers": tiers}]})
    assert "| mode | kind | APS | repeat | computed | engine | buffer | storage_pe | storage_de | turns without |" \
        in lines
    assert "| oracle | online | 0.5 | 1 | 25 (25%) | 75 (75%) | 0 (0%) | 0 (0%) | 0 (0%) | 0 |" in lines
    run = {**_run("basic"), "tiers": sums([turn(0, {"computed": 36, "storage_pe": 64})])}
    text = markdown(_doc([run]))
    assert "## Prompt tokens by tier" in text and "| basic | offline | - | 0 | 36 (36%) | 0 (0%) | 0 (0%) | 64 (64%) " \
        "| 0 (0%) | 0 |" in text
