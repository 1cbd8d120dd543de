"""Storage-gateway wiring: announces the node's read queue; owns the node's storage I/O."""
from __future__ import annotations

import os

from services.storage_gateway.config import GatewayConfig
from shared.messages.registry import GatewayAnnounce
from shared.runtime import Service, service_main


class GatewayService(Service):
    name = "storage-gateway"

    def __init__(self, cfg: GatewayConfig):
        super().__init__(cfg)
        os.makedirs(cfg.store_root, exist_ok=True)

    async def start(self) -> None:
        pass

    def announce(self) -> GatewayAnnounce:
        return GatewayAnnounce(instance=self.instance, node=self.cfg.node, metrics_url=self.metrics_url,
                               pid=os.getpid(), store_root=self.cfg.store_root)


def main(argv: list[str] | None = None) -> int:
    return service_main("storage_gateway", GatewayConfig, GatewayService, argv)
