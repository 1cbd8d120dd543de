"""Load modes are defined once (shared/messages/codes.py) and every list of them derives from there;
the scheduler service reads hits the way each mode says, as the simulator does."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from services.scheduler.config import SchedulerConfig
from services.scheduler.inflight import InFlight
from services.scheduler.placement import place
from services.scheduler.view import MeshView
from shared.config import ConfigError, field_docs, load_config
from shared.messages.codes import BENCH_MODES, COMPARED, LoadMode, mode_names, parse_modes
from shared.messages.registry import EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.messages.storage_gateway import StoreLayout
from shared.messages.plan import Source, blocks
from shared.messages.work import PrefillWork, Sampling
from shared.sched.reads import PendingReads

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "shared" / "messages" / "codes.py"
SOURCES = [p for d in ("services", "shared", "dualpath", "deploy") for p in (ROOT / d).rglob("*.py") if p != HOME]
# "dualpath" is also the project's name (a program, a realm, a cache directory): only the other
# names are words no code outside codes.py may spell; "dualpath" may not be compared against.
OTHERS = {"dualpath-split", "basic", "oracle"}
WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")


def spellings(path: Path, root: Path = ROOT) -> list[str]:
    """Where a module spells load modes: a mode name as a string, a comparison with "dualpath",
    or two or more mode names in one string that is not a docstring (a list of modes written out:
    help texts, messages, settings comments are not strings, so the settings docs derive theirs)."""
    out = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            consts = [n for n in (node.left, *node.comparators) if isinstance(n, ast.Constant)]
            if any(c.value == LoadMode.DUALPATH.value for c in consts):
                out.append(f"{path.relative_to(root)}:{node.lineno}: compares with \"dualpath\"")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in OTHERS:
                out.append(f"{path.relative_to(root)}:{node.lineno}: {node.value!r}")
            elif len(OTHERS & set(WORD.findall(node.value))) >= 2 and id(node) not in docstrings:  # prose may
                out.append(f"{path.relative_to(root)}:{node.lineno}: a mode list in {node.value[:60]!r}")
    return out


def test_no_module_but_codes_spells_the_load_modes():
    found = [hit for path in SOURCES for hit in spellings(path)]
    assert not found, "use shared.messages.codes.LoadMode (or mode_names()):\n" + "\n".join(found)


def test_the_spelling_check_has_teeth(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""A docstring may say basic and oracle."""\n'
                   'MODES = ("dualpath", "basic", "oracle")\n'
                   'def f(m):\n    return m == "dualpath"\n'
                   'HELP = "dualpath (choose) | basic (PE path only) | oracle (no I/O)"\n')
    found = spellings(bad, tmp_path)
    assert len(found) == 4, found  # two names in the tuple, one comparison, the help text's list


def test_mode_names_and_the_compared_default():
    assert mode_names() == ("dualpath", "dualpath-split", "basic", "oracle")
    assert set(COMPARED) <= set(LoadMode) and LoadMode.DUALPATH_SPLIT not in COMPARED
    assert BENCH_MODES == (LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.DUALPATH_SPLIT, LoadMode.ORACLE)
    assert parse_modes(" basic,dualpath-split ") == [LoadMode.BASIC, LoadMode.DUALPATH_SPLIT]
    with pytest.raises(ValueError, match="unknown mode fastest .choose from dualpath, dualpath-split, basic, oracle"):
        parse_modes("dualpath,fastest")
    with pytest.raises(ValueError, match=r"\(none\)"):
        parse_modes(" , ")


def test_the_scheduler_setting_takes_every_mode_and_names_them_when_wrong():
    for name in mode_names():
        assert load_config(SchedulerConfig, "scheduler", env={"DUALPATH_MODE": name}).mode is LoadMode(name)
    with pytest.raises(ConfigError, match="one of dualpath, dualpath-split, basic, oracle") as err:
        load_config(SchedulerConfig, "scheduler", env={"DUALPATH_MODE": "fastest"})
    assert err.value.key == "DUALPATH_MODE"
    assert field_docs(SchedulerConfig)["mode"].endswith(": " + " | ".join(mode_names()))  # --help and the docs


@pytest.mark.parametrize("doc,heading", [("README.md", "Glossary"), ("docs/concepts/design.md", "Load modes")])
def test_the_docs_describe_every_mode(doc, heading):
    text = (ROOT / doc).read_text(encoding="utf-8")
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    for name in mode_names():
        assert f"`{name}`" in section, f"{doc} '{heading}' does not describe `{name}`"


# --- the scheduler service: each request's read path by its mode -------------------------------------

LAYOUT = StoreLayout(bytes(16), "m", 2, 1, 4, "float32", 16)


def view() -> MeshView:
    """One prefill engine on node nA, one decode engine on nB, both announced."""
    v = MeshView(timeout_s=float("inf"))
    for eng, node, role in (("pe0", "nA", "prefill"), ("de0", "nB", "decode")):
        v.update(EngineAnnounce(f"i-{eng}", node, engine=eng, role=role, kv=KVRegion("kv", 64, 16, 2, 1, 1),
                                total_blocks=64, store=LAYOUT), 0.0)
        v.update(TrafficManagerAnnounce(f"t-{eng}", node, engine=eng, ready=True), 0.0)
    return v


def placed(mode: LoadMode, pe_queue: int, de_queue: int):
    reads = PendingReads()
    reads.pending.update({"nA": pe_queue, "nB": de_queue})
    rec = InFlight("r1", list(range(10 * 16 + 1)), Sampling(), hit_blocks=10, block_keys=[bytes(16)] * 10, mode=mode)
    return place(rec, "pe0", "de0", view(), reads, "out.s1")


def pe_path(work: PrefillWork) -> int:
    return blocks(work.plan, Source.STORE, "pe0")


@pytest.mark.parametrize(("pe_queue", "de_queue", "pe_blocks"), [(100, 0, 0), (0, 100, 10), (0, 0, 10)])
def test_dualpath_mode_reads_every_hit_on_the_shorter_queues_path(pe_queue, de_queue, pe_blocks):
    p = placed(LoadMode.DUALPATH, pe_queue, de_queue)
    assert (p.path.pe_blocks, p.path.de_blocks) == (pe_blocks, 10 - pe_blocks)
    assert pe_path(p.work) == pe_blocks and p.work.plan.push and p.work.plan.persist  # the count, explicit on the wire


def test_dualpath_split_mode_splits_a_requests_hits_across_both_paths():
    p = placed(LoadMode.DUALPATH_SPLIT, 100, 0)  # 16-token blocks: PE 100 + 32, DE 0 + 128 tokens
    assert (p.path.pe_blocks, p.path.de_blocks) == (2, 8)
    assert pe_path(p.work) == 2 and p.span_attributes(InFlight("r1", [], Sampling()))["read_path"] == "split"


@pytest.mark.parametrize("mode", [LoadMode.BASIC, LoadMode.ORACLE])
def test_basic_reads_on_the_pe_path_and_oracle_reads_nothing(mode):
    p = placed(mode, 10**6, 0)
    want = 10 if mode is LoadMode.BASIC else 0
    assert (p.path.pe_blocks, p.path.de_blocks, pe_path(p.work)) == (want, 0, want)
    assert blocks(p.work.plan, Source.PRESENT) == 10 - want and p.work.plan.push is (mode is LoadMode.BASIC)


@pytest.mark.parametrize("argv", [["sim", "--modes", "dualpath,fast"],
                                  ["bench", "--url", "http://127.0.0.1:9", "--trace", "gen:32k", "--offline",
                                   "--modes", "dualpath,fast"]], ids=["sim", "bench"])
def test_bench_and_sim_name_a_bad_mode_and_the_choices(argv, capsys):
    from dualpath.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "--modes: unknown mode fast (choose from dualpath, dualpath-split, basic, oracle" in capsys.readouterr().err
