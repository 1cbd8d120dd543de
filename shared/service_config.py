"""The settings every service shares: their dataclass, their checks, NATS connect options, the CLI."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.config import field_docs, require
from shared.priority import MAX_NICE

LOG_LEVELS = ("debug", "info", "warning", "error")
NATS_SCHEMES = ("nats", "tls", "ws", "wss")


@dataclass(frozen=True)
class CommonConfig:
    nats_url: str = "nats://127.0.0.1:4222"  # one URL or a comma-separated cluster list
    namespace: str = "dp"  # subject prefix: isolates one mesh on a shared NATS
    node: str = "node0"  # the host/node this process serves
    instance: str = ""  # unique process id; empty = random
    host: str = "127.0.0.1"  # where this process's listeners bind (loopback by default)
    metrics_port: int = 0  # /metrics port; 0 = any free port (announced)
    heartbeat_s: float = 0.5  # announce period
    quiet_beats: int = 1  # unchanged announcements skipped in a row (a change goes out at the next beat); 0 = every beat
    log_level: str = "info"  # debug | info | warning | error
    nats_wait_s: float = 60.0  # start-up: how long to wait for a reachable NATS server before giving up; 0 = forever
    nice: int = 0  # CPU niceness added to every thread at start, 0..19: on cores shared with other services, a higher value yields them the CPU first (0 = as started)
    # NATS credentials (any one scheme); secrets never appear in logs, traces or repr()
    nats_user: str = ""  # user name (with nats_password)
    nats_password: str = dataclasses.field(default="", repr=False)  # password of nats_user
    nats_token: str = dataclasses.field(default="", repr=False)  # an authentication token
    nats_creds: str = ""  # path of a .creds file (JWT + nkey seed)
    nats_nkey_seed: str = ""  # path of an nkey seed file
    nats_tls_ca: str = ""  # CA bundle: enables TLS to the NATS server
    nats_tls_cert: str = ""  # client certificate (mutual TLS)
    nats_tls_key: str = ""  # client key (mutual TLS)


def nats_options(cfg: CommonConfig) -> dict[str, Any]:
    """nats-py connect options for the configured credentials (user/password, token, creds, nkey, TLS)."""
    opts: dict[str, Any] = {}
    if cfg.nats_user:
        opts.update(user=cfg.nats_user, password=cfg.nats_password)
    if cfg.nats_token:
        opts["token"] = cfg.nats_token
    if cfg.nats_creds:
        opts["user_credentials"] = cfg.nats_creds
    if cfg.nats_nkey_seed:
        opts["nkeys_seed"] = cfg.nats_nkey_seed
    if cfg.nats_tls_ca or cfg.nats_tls_cert:
        import ssl

        ctx = ssl.create_default_context(cafile=cfg.nats_tls_ca or None)
        if cfg.nats_tls_cert:
            ctx.load_cert_chain(cfg.nats_tls_cert, cfg.nats_tls_key or None)
        opts["tls"] = ctx
    return opts


def check_common(cfg: CommonConfig) -> None:
    """Checked before anything is bound or connected."""
    for url in cfg.nats_url.split(","):
        parts = urlsplit(url.strip() if "://" in url else f"nats://{url.strip()}")
        try:
            port = parts.port
        except ValueError:
            port = -1
        require(parts.scheme in NATS_SCHEMES and bool(parts.hostname) and port != -1, "nats_url", cfg.nats_url,
                f"{url!r} is not a NATS URL like nats://host:4222")
    require(cfg.log_level.lower() in LOG_LEVELS, "log_level", cfg.log_level, " | ".join(LOG_LEVELS))
    require(0 <= cfg.metrics_port < 65536, "metrics_port", cfg.metrics_port, "not a port (0 = any free port)")
    require(cfg.heartbeat_s > 0, "heartbeat_s", cfg.heartbeat_s, "must be > 0")
    require(cfg.quiet_beats >= 0, "quiet_beats", cfg.quiet_beats, "must be >= 0 (0 = announce every beat)")
    require(cfg.nats_wait_s >= 0, "nats_wait_s", cfg.nats_wait_s, "must be >= 0 (0 = wait forever)")
    require(0 <= cfg.nice <= MAX_NICE, "nice", cfg.nice, f"a niceness to add, 0..{MAX_NICE} (0 = as started)")
    for key in ("nats_creds", "nats_nkey_seed", "nats_tls_ca", "nats_tls_cert", "nats_tls_key"):
        path = getattr(cfg, key)
        require(not path or Path(path).is_file(), key, path, "no such file")


def config_parser(prog: str, cfg_cls: type) -> argparse.ArgumentParser:
    """Every config field as a flag (`--nats-url`), default None so TOML and env values win."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Settings come from flags > DUALPATH_<SETTING> environment > the TOML file "
                               "(--config) > the defaults shown; see docs/reference/configuration.md.")
    parser.add_argument("--config", help="TOML settings file ([common] + a table per service); "
                                         "default: $DUALPATH_CONFIG, else none")
    docs = field_docs(cfg_cls)
    for f in dataclasses.fields(cfg_cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        shown = "(secret)" if not f.repr and default else repr(getattr(default, "value", default))
        text = f"{docs.get(f.name, f.name.replace('_', ' '))} (default: {shown}; env DUALPATH_{f.name.upper()})"
        if f.name == "nats_url":
            parser.add_argument("--nats-url", "--nats", dest="nats_url", metavar="URL", help=text)
            continue
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, metavar="V",
                            help=text.replace("%", "%%"))
    return parser
