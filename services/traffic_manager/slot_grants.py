"""The traffic-manager's data-plane grants: those it gave for its buffer slots, those it holds.

A given grant covers exactly one request's reserved slots and ends when they are freed; the
transport checks them."""
from __future__ import annotations

from collections import OrderedDict

from shared.transport.base import Endpoint
from shared.transport.grants import Grant, decode_grant, encode_grant

HELD_MAX = 4096  # requests in flight through one PE TM at once is far fewer; the oldest go first


class GrantsGiven:
    def __init__(self, endpoint: Endpoint, region: str = "buf") -> None:
        self.endpoint, self.region = endpoint, region
        self._by_req: dict[str, tuple[tuple[int, ...], bytes]] = {}  # req -> (slot offsets, encoded grant)
        self._grants: dict[str, Grant] = {}

    def give(self, req_id: str, offsets: list[int], block_nbytes: int) -> bytes:
        """The encoded grant of `offsets` for `req_id`: the same one for the same slots, else a fresh one."""
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
        g = self._grants.pop(req_id, None)
        self._by_req.pop(req_id, None)
        if g is not None:
            self.endpoint.revoke(g)

    def __len__(self) -> int:
        return len(self._grants)


class GrantsHeld:
    """Grants other TMs gave this one, by (request, their engine); bounded."""

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
