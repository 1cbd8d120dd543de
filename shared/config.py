"""Settings: one frozen dataclass per service, filled from defaults < TOML < env < CLI.

Env overrides are `DUALPATH_<FIELD>`; only entry points call `load_config`.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar

import msgspec

ENV_PREFIX = "DUALPATH_"
T = TypeVar("T")


class ConfigError(ValueError):
    """A setting that cannot be used; `key` names it, `value` is what was given."""

    def __init__(self, key: str, value: object, reason: str):
        super().__init__(f"bad setting {key}={value!r}: {reason}")
        self.key, self.value, self.reason = key, value, reason


def _base_type(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


_NONE = ("", "none", "null")  # spellings of "not set" for an optional setting
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _as_given(raw: Any, tp: Any) -> Any:
    """`raw` in the shape msgspec.convert takes for `tp`: none spellings, on/off, comma lists settled."""
    inner, optional = _base_type(tp)
    if optional and (raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE)):
        return None
    if inner is bool and not isinstance(raw, bool):
        text = str(raw).strip().lower()
        return _BOOLS.get(text, text)
    if inner in (int, float) and isinstance(raw, str):
        return raw.strip()
    if inner is str and isinstance(raw, (int, float)):
        return str(raw)
    if typing.get_origin(inner) is tuple:
        items = [x.strip() for x in raw.split(",")] if isinstance(raw, str) else raw
        if isinstance(items, list):
            (elem, *_rest) = typing.get_args(inner) or (str,)
            return [_as_given(x, elem) for x in items if x != ""]
    return raw


def _coerce(key: str, raw: Any, tp: Any) -> Any:
    try:
        return msgspec.convert(_as_given(raw, tp), type=tp, strict=False)
    except msgspec.ValidationError as exc:
        values = choices(tp)
        raise ConfigError(key, raw, f"one of {', '.join(values)}" if values else str(exc)) from None


def choices(tp: Any) -> tuple[str, ...]:
    inner, _ = _base_type(tp)
    return tuple(str(m.value) for m in inner) if isinstance(inner, type) and issubclass(inner, enum.Enum) else ()


def read_toml(path: str | Path | None, section: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if not path:
        return {}, {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError("config", str(path), "file not found") from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config", str(path), f"not valid TOML: {exc}") from None
    return dict(data.get("common", {})), dict(data.get(section, {}))


def load_config(
    cls: type[T],
    section: str,
    *,
    file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    common: type | None = None,
) -> T:
    """With `common`, a `[common]` key that is none of its fields fails; without, keys `cls` lacks
    are skipped."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    shared, own = read_toml(file, section)
    everyone = {f.name for f in dataclasses.fields(common)} if common is not None else None
    for key, raw in shared.items():
        if everyone is not None and key not in everyone:
            raise ConfigError(f"common.{key}", raw, "not a setting of every service: move it to the tables of "
                                                    "the services that have it ([scheduler], [prefill_engine], ...)")
        if key in fields:
            values[key] = _coerce(f"common.{key}", raw, hints[key])
    for key, raw in own.items():
        if key not in fields:
            raise ConfigError(f"{section}.{key}", raw, "unknown setting")
        values[key] = _coerce(f"{section}.{key}", raw, hints[key])
    env = os.environ if env is None else env
    for name in fields:
        env_key = ENV_PREFIX + name.upper()
        if env_key in env:
            values[name] = _coerce(env_key, env[env_key], hints[name])
    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        if key not in fields:
            raise ConfigError(key, raw, "unknown setting")
        values[key] = _coerce(key, raw, hints[key])
    cfg = cls(**values)
    check = getattr(cfg, "validate", None)
    if check is not None:
        check()
    return cfg


_FIELD = re.compile(r"^\s+(\w+)\s*:[^=#]*=[^#]*?(?:#\s*(.*))?$")


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the `# comment` after its declaration (subclass wins) and an Enum's values:
    the help text of each setting."""
    out = _comments(cls)
    hints = typing.get_type_hints(cls)
    for name, tp in hints.items():
        if values := choices(tp):
            out[name] = f"{out.get(name, name.replace('_', ' '))}: {' | '.join(values)}"
    return out


def _comments(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        for line in lines:
            m = _FIELD.match(line)
            if m and m.group(2):
                out[m.group(1)] = m.group(2).strip()
    return out


def require(cond: bool, key: str, value: object, reason: str) -> None:
    if not cond:
        raise ConfigError(key, value, reason)
