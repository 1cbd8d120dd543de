"""The subjects of one mesh: `ns` (tests use a uuid) and its endpoints' subjects, typed."""
from __future__ import annotations

from shared.messages.typed_subject import BusEndpoint, Subject


class Subjects:
    """`Subjects(ns).at(EP.TM_PUSH, engine=e)`: that endpoint's subject in mesh `ns` (the table of
    endpoints, their message and reply types: shared/messages/endpoints.py)."""

    def __init__(self, ns: str = "dp"):
        self.ns = ns

    def at(self, endpoint: BusEndpoint, **params: str) -> Subject:
        return endpoint.at(self.ns, **params)
