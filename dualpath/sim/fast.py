"""The simulator's compiled core: its hot modules built with mypyc, and loaded only while fresh.

`build()` compiles MODULES into build/sim-fast/; `activate()` serves them only when the build
matches the sources and interpreter, and never inside pytest or with DUALPATH_SIM_BUILD=pure.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (sources and build/ live here)
OUT = ROOT / "build" / "sim-fast"
MODULES = (
    "dualpath.sim.cluster", "dualpath.sim.decode", "dualpath.sim.dispatch", "dualpath.sim.engine",
    "dualpath.sim.models", "dualpath.sim.prefill", "dualpath.sim.resources", "dualpath.sim.workload",
    "shared.sched.dispatch", "shared.sched.ledger", "shared.sched.reads", "shared.sched.policy.de_assign",
    "shared.sched.policy.intra_pe", "shared.sched.policy.pe_assign", "shared.sched.policy.read_path",
    "shared.sched.policy.types",
)
BUILD = "pure Python (no compiled build: make sim-fast)"  # which build this process runs, set by activate()


def source(name: str) -> Path:
    return ROOT.joinpath(*name.split(".")).with_suffix(".py")


def digest() -> str:
    """sha256 over MODULES' sources, in order: a build is fresh only for these exact bytes."""
    h = hashlib.sha256()
    for name in MODULES:
        h.update(name.encode() + b"\0" + source(name).read_bytes() + b"\0")
    return h.hexdigest()


def _abi() -> str:
    return f"{sys.implementation.cache_tag}-{sysconfig.get_config_var('EXT_SUFFIX')}"


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the built modules (and mypyc's shared library) from build/sim-fast."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname, path=None, target=None):
        f = self.files.get(fullname)
        if f is None:
            return None
        return importlib.util.spec_from_file_location(fullname, f, loader=importlib.machinery.ExtensionFileLoader(
            fullname, str(f)))


def activate() -> str:
    """Load the compiled build for this process if it is fresh; returns (and sets) BUILD."""
    global BUILD
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return BUILD
    manifest = OUT / "manifest.json"
    why = ""
    if os.environ.get("DUALPATH_SIM_BUILD", "auto") == "pure":
        why = "DUALPATH_SIM_BUILD=pure"
    elif "pytest" in sys.modules:
        why = "under pytest"
    elif not manifest.exists():
        why = "no compiled build: make sim-fast"
    else:
        m = json.loads(manifest.read_text())
        if m.get("abi") != _abi():
            why = f"compiled build is for {m.get('abi')}, this interpreter is {_abi()}"
        elif m.get("digest") != digest():
            why = "compiled build is stale (sources changed since: make sim-fast)"
        elif any(name in sys.modules for name in MODULES):
            why = "simulator modules were imported before the compiled build could load"
    if why:
        BUILD = f"pure Python ({why})"
        return BUILD
    files = {name: OUT / f for name, f in m["files"].items()}
    finder = _Finder(files)
    sys.meta_path.insert(0, finder)
    try:
        for name in MODULES:
            __import__(name)
    except ImportError as e:  # a broken build: back to the sources, as if it were absent
        sys.meta_path.remove(finder)
        for name in files:
            sys.modules.pop(name, None)
        BUILD = f"pure Python (compiled build failed to load: {e})"
        return BUILD
    BUILD = f"compiled (mypyc, {len(MODULES)} modules)"
    return BUILD


def build(mypyc: list[str] | None = None) -> Path:
    """Compile MODULES with mypyc from a copy of the sources into build/sim-fast (RuntimeError on failure)."""
    cmd = mypyc or [sys.executable, "-m", "mypyc"]
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    before = digest()
    work = OUT.with_name(OUT.name + ".src")
    shutil.rmtree(work, ignore_errors=True)
    for pkg in ("dualpath", "shared"):  # whole packages, so that mypy sees every type they import
        shutil.copytree(ROOT / pkg, work / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    t0 = time.perf_counter()
    try:
        res = subprocess.run([*cmd, "--ignore-missing-imports", *(str(source(n).relative_to(ROOT)) for n in MODULES)],
                             cwd=work, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"mypyc failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
        if digest() != before:
            raise RuntimeError("the sources changed while they compiled; build again")
        made = [p.relative_to(work) for p in work.glob("*__mypyc*" + ext)]
        made += [source(n).relative_to(ROOT).with_suffix(ext) for n in MODULES]
        shutil.rmtree(OUT, ignore_errors=True)
        files = {}
        for rel in made:
            if not (work / rel).exists():
                raise RuntimeError(f"mypyc made no {rel}")
            (OUT / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(work / rel), OUT / rel)
            files[".".join(rel.with_suffix("").with_suffix("").parts)] = str(rel)
        (OUT / "manifest.json").write_text(json.dumps(
            {"digest": before, "abi": _abi(), "files": files, "seconds": round(time.perf_counter() - t0, 1)},
            indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return OUT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say whether a fresh build would load")
    a = p.parse_args(argv)
    if not a.check:
        try:
            import mypyc  # noqa: F401
        except ImportError:
            print("sim-fast: mypyc is not installed (pip install mypy); the simulator stays pure Python")
            return 1
        if shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc") is None:
            print("sim-fast: no C compiler; the simulator stays pure Python")
            return 1
        t0 = time.perf_counter()
        try:
            build()
        except RuntimeError as e:
            print(f"sim-fast: {e}\nthe simulator stays pure Python")
            return 1
        print(f"sim-fast: {len(MODULES)} modules compiled into {OUT.relative_to(ROOT)} in "
              f"{time.perf_counter() - t0:.0f} s")
    print(f"sim-fast: {activate()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
