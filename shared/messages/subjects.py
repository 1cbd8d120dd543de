"""The subjects of one mesh: `ns` (tests use a uuid) and its endpoints' subjects, typed."""
from __future__ import annotations

from shared.messages.typed_subject import BusEndpoint, Subject

_KEEP = 4096  # subjects remembered per mesh (engines x verbs, reply subjects): built once, not per message


class Subjects:
    """`Subjects(ns).at(EP.TM_PUSH, engine=e)`: that endpoint's subject in mesh `ns`."""

    def __init__(self, ns: str = "dp"):
        self.ns = ns
        self._built: dict[tuple, Subject] = {}

    def at(self, endpoint: BusEndpoint, **params: str) -> Subject:
        key = (endpoint.name, *params.items())
        subject = self._built.get(key)
        if subject is None:
            if len(self._built) >= _KEEP:
                self._built.clear()
            subject = self._built[key] = endpoint.at(self.ns, **params)
        return subject
