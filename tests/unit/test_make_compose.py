"""`make compose-*` runs whichever compose is installed: Docker's compose plugin when
`docker compose version` works, else the venv's standalone docker-compose; in deploy/compose."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")]

ROOT = Path(__file__).resolve().parents[2]


def _fake_docker(bin_dir: Path, plugin: bool) -> None:
    """A `docker` whose `compose version` succeeds only when the plugin is 'installed'."""
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text("#!/bin/sh\n" + ('[ "$1" = compose ] && exit 0\n' if plugin else "") + "exit 1\n")
    script.chmod(0o755)


def _dry_run(bin_dir: Path, *argv: str) -> str:
    """The last command `make -n` would run (the install recipe comes first on a fresh checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"  # (a `make test ARGS=...` around the suite passes nothing on)
    done = subprocess.run(["make", "--no-print-directory", "-n", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1].strip()


@pytest.mark.parametrize("target, command", [("compose-up", "up -d"), ("compose-down", "down"),
                                             ("compose-logs", "logs"), ("compose-build", "build")])
def test_the_plugin_is_used_when_docker_compose_version_works(tmp_path, target, command):
    _fake_docker(tmp_path / "bin", plugin=True)
    assert _dry_run(tmp_path / "bin", target) == f"cd deploy/compose && docker compose {command}"


@pytest.mark.parametrize("target, command", [("compose-up", "up -d"), ("compose-down", "down")])
def test_without_the_plugin_the_venvs_docker_compose_is_used(tmp_path, target, command):
    _fake_docker(tmp_path / "bin", plugin=False)
    venv = ROOT / ".venv" / "bin" / "docker-compose"
    assert _dry_run(tmp_path / "bin", target) == f"cd deploy/compose && {venv} {command}"


def test_flags_go_before_the_command_and_args_after_it(tmp_path):
    _fake_docker(tmp_path / "bin", plugin=True)
    line = _dry_run(tmp_path / "bin", "compose-up", "COMPOSE_FLAGS=--profile dashboard",
                    "ARGS=--scale prefill-engine=3")
    assert line == "cd deploy/compose && docker compose --profile dashboard up -d --scale prefill-engine=3"
    assert _dry_run(tmp_path / "bin", "compose", "ARGS=ps") == "cd deploy/compose && docker compose ps"
