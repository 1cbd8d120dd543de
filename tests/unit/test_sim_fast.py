"""The compiled simulator core (dualpath/sim/fast.py): loaded only while fresh, and the same figures."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath.sim import fast

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _activate_in_child(out: Path, then: str = "", build: str = "auto") -> str:
    """activate() in a fresh interpreter (this one has the simulator imported), with OUT = out."""
    code = (f"import dualpath.sim.fast as f, pathlib; f.OUT = pathlib.Path({str(out)!r}); print(f.activate())\n"
            f"{then}")
    env = {**os.environ, "DUALPATH_SIM_BUILD": build}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _manifest(out: Path, **over) -> None:
    out.mkdir(parents=True, exist_ok=True)
    m = {"digest": fast.digest(), "abi": fast._abi(), "files": {}}
    m.update(over)
    (out / "manifest.json").write_text(json.dumps(m))


def test_no_build_stale_build_or_other_interpreter_runs_pure_python(tmp_path):
    assert _activate_in_child(tmp_path / "none").startswith("pure Python (no compiled build")
    _manifest(tmp_path / "stale", digest="0" * 64)
    assert "stale" in _activate_in_child(tmp_path / "stale")
    _manifest(tmp_path / "abi", abi="cpython-39-.so")
    assert "this interpreter is" in _activate_in_child(tmp_path / "abi")


def test_a_build_that_fails_to_load_falls_back_to_the_sources(tmp_path):
    out = tmp_path / "broken"
    (out / "dualpath" / "sim").mkdir(parents=True)
    (out / "dualpath" / "sim" / "engine.so").write_bytes(b"not an extension")
    _manifest(out, files={"dualpath.sim.engine": "dualpath/sim/engine.so"})
    got = _activate_in_child(out, "import dualpath.sim.engine as e; print(e.__file__)")
    first, second = got.splitlines()
    assert first.startswith("pure Python (compiled build failed to load")
    assert second.endswith("dualpath/sim/engine.py")


def test_modules_already_imported_are_never_swapped(tmp_path, monkeypatch):
    import dualpath.sim.engine  # noqa: F401  (a fresh build would now mix with loaded modules)
    _manifest(tmp_path)
    monkeypatch.setattr(fast, "OUT", tmp_path)
    monkeypatch.setattr(fast, "BUILD", fast.BUILD)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, fast._Finder)])
    assert fast.activate() == "pure Python (under pytest)"
    monkeypatch.delitem(sys.modules, "pytest")  # as if a program had imported the simulator first
    assert "imported before" in fast.activate()
    assert not any(isinstance(f, fast._Finder) for f in sys.meta_path)


def test_a_failed_compile_says_why_and_leaves_no_build(tmp_path, monkeypatch):
    monkeypatch.setattr(fast, "OUT", tmp_path / "sim-fast")
    with pytest.raises(RuntimeError, match="(?s)mypyc failed \\(3\\).*no compiler here"):
        fast.build([sys.executable, "-c", "import sys; print('no compiler here'); sys.exit(3)"])
    assert not (tmp_path / "sim-fast").exists() and not (tmp_path / "sim-fast.src").exists()
    assert not list(ROOT.glob("dualpath/sim/*.so")) and not list(ROOT.glob("shared/sched/**/*.so"))


@pytest.mark.skipif(not (fast.OUT / "manifest.json").exists(), reason="no compiled build (make sim-fast)")
def test_the_compiled_build_gives_the_pinned_figures():
    """With a fresh build, the golden runs of test_sim_golden.py give the same figures compiled."""
    if json.loads((fast.OUT / "manifest.json").read_text()).get("digest") != fast.digest():
        pytest.skip("the compiled build is stale (make sim-fast)")
    got = _activate_in_child(fast.OUT, (
        "import json, dualpath.sim.engine as e\n"
        "from dualpath.sim.config import SimConfig\n"
        "from tests.unit.test_sim_golden import PINNED, SMALL\n"
        "assert e.__file__.endswith('.so'), e.__file__\n"
        "e.run_sim(SimConfig(progress=True, **SMALL))\n"  # the progress bar too: a typed attribute once refused it
        "print(json.dumps([[m, a, n, {k: e.run_sim(SimConfig(mode=m, assign=a, read_near_tie=n, **SMALL)).to_dict()[k]"
        " for k in want}] for (m, a, n), want in PINNED.items()]))\n"))
    first, figures = got.splitlines()
    assert first.startswith("compiled (mypyc")
    assert _activate_in_child(fast.OUT, build="pure").strip() == "pure Python (DUALPATH_SIM_BUILD=pure)"
    from tests.unit.test_sim_golden import PINNED
    for mode, assign, near, fig in json.loads(figures):
        assert fig == pytest.approx(PINNED[(mode, assign, near)], rel=1e-12, abs=0)
