"""Model presets: Hugging Face config.json files and the ModelArch parsed from them.

Stable API (add fields with defaults, never change types): `load_arch(name or path)`,
`preset_names()`, `ModelArch`, `ArchConfigError`. Counts are elements; no hardware assumptions.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from dualpath.presets.arch import ArchConfigError, ModelArch, from_config
from dualpath.presets.counts import ParamCounts

__all__ = ["ArchConfigError", "ModelArch", "ParamCounts", "load_arch", "load_config",
           "preset_names"]


def preset_names() -> list[str]:
    files = resources.files(__name__).iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".json"))


def load_config(name_or_path: str) -> tuple[str, dict]:
    """(name, raw config dict) for a preset name or a path to a config.json."""
    if name_or_path in preset_names():
        text = resources.files(__name__).joinpath(f"{name_or_path}.json").read_text()
        return name_or_path, json.loads(text)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ArchConfigError(name_or_path, "model",
                          f"not a preset ({', '.join(preset_names())}) nor a config.json file")
    try:
        return path.parent.name or path.stem, json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ArchConfigError(str(path), "json", str(exc)) from exc


def load_arch(name_or_path: str) -> ModelArch:
    name, cfg = load_config(name_or_path)
    if not isinstance(cfg, dict):
        raise ArchConfigError(name, "json", "top level must be an object")
    return from_config(cfg, name)
