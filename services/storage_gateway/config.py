"""Storage-gateway settings (one gateway per node)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from shared.config import require
from shared.runtime import CommonConfig


def default_store() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dualpath", "store")


@dataclass(frozen=True)
class GatewayConfig(CommonConfig):
    store: str = ""  # store root (a directory or shared POSIX mount); empty = user cache dir
    capacity_gb: float = 0.0  # byte limit with LRU eviction; 0 = unlimited
    read_gbps: float = 0.0  # storage-NIC read cap (emulation); 0 = uncapped
    write_gbps: float = 0.0  # storage-NIC write cap (emulation); 0 = uncapped
    io_threads: int = 4

    @property
    def store_root(self) -> str:
        return self.store or default_store()

    def validate(self) -> None:
        require(self.capacity_gb >= 0, "capacity_gb", self.capacity_gb, "must be >= 0")
        require(self.read_gbps >= 0, "read_gbps", self.read_gbps, "must be >= 0")
        require(self.write_gbps >= 0, "write_gbps", self.write_gbps, "must be >= 0")
        require(self.io_threads > 0, "io_threads", self.io_threads, "must be > 0")
