"""Regenerate the settings reference from the config dataclasses (the only source of truth).

Writes deploy/compose/dualpath.toml and the tables between the settings markers of the
configuration page; `--check` exits 1 when either is stale. Imports only the config modules.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from services.decode_engine.config import DecodeEngineConfig  # noqa: E402
from services.prefill_engine.config import PrefillEngineConfig  # noqa: E402
from services.scheduler.config import SchedulerConfig  # noqa: E402
from services.storage_gateway.config import StorageGatewayConfig  # noqa: E402
from services.traffic_manager.config import TrafficManagerConfig  # noqa: E402
from shared.config import field_docs  # noqa: E402
from shared.service_config import CommonConfig  # noqa: E402

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
# Meanings for fields whose declaration carries no comment.
FALLBACK = {
    "log_level": "debug | info | warning | error",
    "http_port": "the OpenAI-style front door's port",
    "dtype": "model and KV dtype: float32 | bfloat16 | float16",
    "bulk_weight": "bulk share of the traffic-class weights (see latency_weight)",
    "io_threads": "threads doing storage file I/O",
}
TOML_PATH = ROOT / "deploy" / "compose" / "dualpath.toml"
DOC_PATH = ROOT / "docs" / "configuration.md"
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def own_fields(section: str) -> list[dataclasses.Field]:
    cls, _ = SECTIONS[section]
    if section == "common":
        return list(dataclasses.fields(cls))
    common = {f.name for f in dataclasses.fields(CommonConfig)}
    return [f for f in dataclasses.fields(cls) if f.name not in common]


def describe(section: str, name: str) -> str:
    return field_docs(SECTIONS[section][0]).get(name) or FALLBACK.get(name, "")


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def render_toml() -> str:
    lines = [
        "# dualpath settings: every setting of every service, at its default.",
        "# Generated from the config dataclasses by deploy/compose/gen_settings.py; do not edit",
        "# by hand -- copy it, delete what you do not change, and edit the rest.",
        "#",
        "# Precedence: defaults < this file < DUALPATH_<FIELD> env < --field-name flags.",
        "# Use: `dualpath service <name> --config FILE` or env DUALPATH_CONFIG=FILE.",
        "# A service reads [common] plus its own table (its own table wins); an unknown key",
        "# is an error at start-up. In docker-compose.yml the environment sets nats_url, host,",
        "# http_host, store, node and the metrics ports, so those lines here are overridden.",
    ]
    for section in SECTIONS:
        _, who = SECTIONS[section]
        lines += ["", f"[{section}]" + ("  # read by every service" if section == "common" else "")]
        if section in ("prefill_engine", "decode_engine"):
            lines.append("# engine settings shared by prefill and decode engines come first")
        for f in own_fields(section):
            text = f"{f.name} = {toml_value(f.default)}"
            note = describe(section, f.name)
            lines.append(f"{text:<36}# {note}" if note else text)
    return "\n".join(lines) + "\n"


def render_tables() -> str:
    out = []
    for section in SECTIONS:
        cls, who = SECTIONS[section]
        title = "`[common]` — every service" if section == "common" else f"`[{section}]` — {who}"
        out += [f"### {title}", ""]
        if section in ("prefill_engine", "decode_engine"):
            out += ["Fields down to `threads` are shared by both engines (`shared/engine/config.py`).", ""]
        out += ["| setting | env | default | meaning |", "|---|---|---|---|"]
        for f in own_fields(section):
            default = toml_value(f.default)
            meaning = describe(section, f.name).replace("|", "\\|")
            out.append(f"| `{f.name}` | `DUALPATH_{f.name.upper()}` | `{default}` | {meaning} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def splice_doc(doc: str) -> str:
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{render_tables()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    args = ap.parse_args(argv)
    wanted = {TOML_PATH: render_toml(), DOC_PATH: splice_doc(DOC_PATH.read_text())}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run deploy/compose/gen_settings.py)", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(wanted[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
