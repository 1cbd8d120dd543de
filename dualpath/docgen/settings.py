"""docs/reference/settings.md and deploy/compose/dualpath.toml: every setting, from the config dataclasses.

The dataclasses are the only source: a field's `# comment` is its meaning, its type and
default are the code's, its flags those of the parser `dualpath service NAME` builds.
Each table lists the fields one class declares, so settings both engines share appear once.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import json
import typing

from dualpath.docgen.common import REFERENCE, ROOT, cell, code, heading, table
from services.decode_engine.config import DecodeEngineConfig
from services.prefill_engine.config import PrefillEngineConfig
from services.scheduler.config import SchedulerConfig
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.config import TrafficManagerConfig
from shared.config import field_docs
from shared.engine.config import EngineConfig
from shared.service_config import CommonConfig, config_parser

PAGE = REFERENCE / "settings.md"
TOML = ROOT / "deploy" / "compose" / "dualpath.toml"
# TOML table -> (dataclass, service name on the command line). `common` holds the
# CommonConfig fields; each service table holds only the fields its class adds.
SECTIONS = {
    "common": (CommonConfig, "every service"),
    "scheduler": (SchedulerConfig, "scheduler"),
    "prefill_engine": (PrefillEngineConfig, "prefill-engine"),
    "decode_engine": (DecodeEngineConfig, "decode-engine"),
    "traffic_manager": (TrafficManagerConfig, "traffic-manager"),
    "storage_gateway": (StorageGatewayConfig, "storage-gateway"),
}
TITLES = {  # classes that declare settings -> their table's heading
    CommonConfig: "`[common]` — every service (also in any service's own table)",
    SchedulerConfig: "`[scheduler]` — `dualpath service scheduler`",
    EngineConfig: "`[prefill_engine]` and `[decode_engine]` — both engines (each in its own table)",
    PrefillEngineConfig: "`[prefill_engine]` — `dualpath service prefill-engine`",
    DecodeEngineConfig: "`[decode_engine]` — `dualpath service decode-engine`",
    TrafficManagerConfig: "`[traffic_manager]` — `dualpath service traffic-manager`",
    StorageGatewayConfig: "`[storage_gateway]` — `dualpath service storage-gateway`",
}
INTRO = [
    "Precedence: defaults < TOML file (`--config`) < `DUALPATH_<NAME>` environment < flags; how values",
    "are read and checked: [configuration.md](configuration.md). Each table lists the settings one class",
    "declares; a service reads `[common]` plus its own table. `deploy/compose/dualpath.toml` has every",
    "setting at its default.",
    "",
]


def own_fields(section: str) -> list[dataclasses.Field]:
    """The fields of `section`'s table in the TOML file: [common] the shared ones, a service its own."""
    cls, _ = SECTIONS[section]
    if section == "common":
        return list(dataclasses.fields(cls))
    common = {f.name for f in dataclasses.fields(CommonConfig)}
    return [f for f in dataclasses.fields(cls) if f.name not in common]


@functools.cache
def _docs(cls: type) -> dict[str, str]:
    return field_docs(cls)


def describe(cls: type, name: str) -> str:
    """A setting's meaning: the `# comment` after its declaration."""
    return _docs(cls).get(name, "")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return json.dumps(str(value.value))
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_toml() -> str:
    lines = [
        "# dualpath settings: every setting of every service, at its default.",
        "# Generated from the config dataclasses by `python -m dualpath.docgen --write`; do not edit",
        "# by hand -- copy it, delete what you do not change, and edit the rest.",
        "#",
        "# Precedence: defaults < this file < DUALPATH_<FIELD> env < --field-name flags.",
        "# Use: `dualpath service <name> --config FILE` or env DUALPATH_CONFIG=FILE.",
        "# A service reads [common] plus its own table (its own table wins); an unknown key",
        "# is an error at start-up. In docker-compose.yml the environment sets nats_url, host,",
        "# http_host, store, node and the metrics ports, so those lines here are overridden.",
    ]
    for section, (cls, _) in SECTIONS.items():
        lines += ["", f"[{section}]" + ("  # read by every service" if section == "common" else "")]
        if section in ("prefill_engine", "decode_engine"):
            lines.append("# engine settings shared by prefill and decode engines come first")
        for f in own_fields(section):
            text = f"{f.name} = {toml_value(f.default)}"
            note = describe(cls, f.name)
            lines.append(f"{text:<36}# {note}" if note else text)
    return "\n".join(lines) + "\n"


def declared() -> dict[type, list[dataclasses.Field]]:
    """Each class that declares settings -> the fields it declares, in the order of TITLES."""
    out: dict[type, list[dataclasses.Field]] = {}
    for cls, _ in SECTIONS.values():
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for klass in cls.__mro__:
            if klass in TITLES:
                own = klass.__dict__.get("__annotations__", {})
                out.setdefault(klass, [fields[n] for n in own if n in fields])
    missing = [c.__name__ for c in out if c not in TITLES]
    assert not missing, f"give {missing} a heading in TITLES"
    return {c: out[c] for c in TITLES if c in out}


def type_name(tp: object) -> str:
    """A setting's type as a user writes it: str, int, float, bool, list[str]; an enum is a str."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "str"
    if typing.get_origin(tp) in (tuple, list):
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def flags(cls: type) -> dict[str, str]:
    """Setting -> its flags, as `dualpath service` parses them."""
    parser = config_parser("docgen", cls)
    return {a.dest: ", ".join(code(o) for o in a.option_strings) for a in parser._actions if a.option_strings}


def section_table(cls: type, fields: list[dataclasses.Field]) -> list[str]:
    hints, flag = typing.get_type_hints(cls), flags(cls)
    rows = [(code(f.name), code(type_name(hints[f.name])), code(toml_value(f.default)),
             code(f"DUALPATH_{f.name.upper()}"), flag[f.name], cell(describe(cls, f.name)))
            for f in fields]
    return table(("setting", "type", "default", "env", "flag", "meaning"), rows)


def render() -> str:
    lines = heading("Settings", "the config dataclasses (`services/*/config.py`, `shared/engine/config.py`, "
                    "`shared/service_config.py`)", INTRO)
    for cls, fields in declared().items():
        lines += [f"## {TITLES[cls]}", "", *section_table(cls, fields)]
    return "\n".join(lines).rstrip() + "\n"


PAGES = {PAGE: render, TOML: render_toml}
