"""`dualpath service <name> [settings]`: run one service on its own (bare-metal scaling)."""
from __future__ import annotations

import argparse
import importlib

SERVICES = {
    "scheduler": "services.scheduler.app",
    "prefill-engine": "services.prefill_engine.app",
    "decode-engine": "services.decode_engine.app",
    "traffic-manager": "services.traffic_manager.app",
    "storage-gateway": "services.storage_gateway.app",
}


def cli_name(name: str) -> str:
    """The command line's spelling of a service's one name: `prefill_engine` -> `prefill-engine`."""
    return name.replace("_", "-")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run one service process (settings: flags, DUALPATH_* env, --config TOML)",
                       description="Run one service process. Its settings come from flags, DUALPATH_* environment "
                                   "variables or a TOML file (--config); `dualpath service NAME --help` lists them.",
                       add_help=False)
    p.add_argument("-h", "--help", action="help", help="show this help message and exit")
    p.add_argument("name", type=cli_name, choices=sorted(SERVICES), help="which service (also with _: prefill_engine)")
    p.add_argument("settings", nargs=argparse.REMAINDER,
                   help="that service's settings, e.g. --nats nats://host:4222 --node n1")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(SERVICES[args.name]).main(args.settings)
