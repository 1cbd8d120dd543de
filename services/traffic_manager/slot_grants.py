"""The traffic-manager's data-plane grants: those it gave for its buffer slots, those it holds.

Owns `GrantsGiven` (DE side: per request, one grant of exactly the buffer slots reserved
for it, made when they are reserved and revoked when they are freed, so a peer reaches
no other request's slots and nothing after the request let go) and `GrantsHeld` (PE
side: the grants other TMs replied with, kept until this TM's transfers for the request
are done). Grants ride the bus encoded (`Reserved.grant`, `Staged.grant`); the transport
owns the checks (shared/transport/grants.py).

Example: DE TM reserves slots at offsets [3 MiB, 4 MiB] (1 MiB blocks) for r1 ->
`given.give("r1", [3 << 20, 4 << 20], 1 << 20)` -> grant of [3 MiB, 5 MiB) in Reserved;
the PE TM `held.keep("r1", "d0-e0", g)`, reads staged blocks, later pushes the misses with
`held.get("r1", "d0-e0")`, then `held.drop("r1")`; LoadKV frees r1's slots on the DE ->
`given.take_back("r1")`.
"""
from __future__ import annotations

from collections import OrderedDict

from shared.transport.base import Endpoint
from shared.transport.grants import Grant, decode_grant, encode_grant

HELD_MAX = 4096  # requests in flight through one PE TM at once is far fewer; the oldest go first


class GrantsGiven:
    """Grants of this TM's buffer slots, one per request (DE side)."""

    def __init__(self, endpoint: Endpoint, region: str = "buf") -> None:
        self.endpoint, self.region = endpoint, region
        self._by_req: dict[str, tuple[tuple[int, ...], bytes]] = {}  # req -> (slot offsets, encoded grant)
        self._grants: dict[str, Grant] = {}

    def give(self, req_id: str, offsets: list[int], block_nbytes: int) -> bytes:
        """The encoded grant of `offsets` (one block each) for `req_id`; the same one again for the
        same slots (a Stage after a Reserve), a fresh one (the old revoked) for others."""
        key = tuple(offsets)
        have = self._by_req.get(req_id)
        if have is not None and have[0] == key:
            return have[1]
        self.take_back(req_id)
        g = self.endpoint.grant(self.region, [(off, block_nbytes) for off in offsets])
        raw = encode_grant(g)
        self._by_req[req_id], self._grants[req_id] = (key, raw), g
        return raw

    def take_back(self, req_id: str) -> None:
        """`req_id`'s slots were freed: its grant ends (peers' frames naming it are refused)."""
        g = self._grants.pop(req_id, None)
        self._by_req.pop(req_id, None)
        if g is not None:
            self.endpoint.revoke(g)

    def __len__(self) -> int:
        return len(self._grants)


class GrantsHeld:
    """Grants other TMs gave this one, by (request, their engine) (PE side); bounded."""

    def __init__(self, cap: int = HELD_MAX) -> None:
        self.cap = cap
        self._held: OrderedDict[tuple[str, str], Grant] = OrderedDict()

    def keep(self, req_id: str, engine: str, raw: bytes) -> Grant | None:
        g = decode_grant(raw)
        if g is not None:
            self._held[(req_id, engine)] = g
            self._held.move_to_end((req_id, engine))
            while len(self._held) > self.cap:
                self._held.popitem(last=False)
        return g

    def get(self, req_id: str, engine: str) -> Grant | None:
        return self._held.get((req_id, engine))

    def drop(self, req_id: str) -> None:
        for key in [k for k in self._held if k[0] == req_id]:
            del self._held[key]

    def __len__(self) -> int:
        return len(self._held)
