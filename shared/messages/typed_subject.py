"""A typed subject: one endpoint of the mesh (its pattern, message type, reply type) and its subjects."""
from __future__ import annotations

import re
import typing
from types import UnionType
from typing import Any

_FIELD = re.compile(r"\{(\w+)\}")
_BAD = re.compile(r"[*>\s]")  # no wildcard, no space (a dotted name spans tokens, as it always did)


def _members(tp: Any) -> list[Any]:
    """A union's members (nested unions flattened), or `tp` alone."""
    if isinstance(tp, UnionType) or typing.get_origin(tp) is typing.Union:
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def _classes(tp: Any) -> tuple[type, ...]:
    return tuple(typing.get_origin(m) or m for m in _members(tp))


def _items(tp: Any) -> tuple[type, ...]:
    return tuple(c for m in _members(tp) if typing.get_origin(m) is list for c in _classes(typing.get_args(m)[0]))


def type_name(tp: Any) -> str:
    """`tp` as a reader would write it: `PushKV`, `TokenEvent | StepEvents`, `list[Accepted | Finished]`."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", str(tp)).replace("typing.", "")


class Subject(str):
    """A subject string built by `endpoint.at(...)`: it carries `endpoint`."""

    endpoint: "BusEndpoint"

    def __new__(cls, text: str, endpoint: "BusEndpoint") -> "Subject":
        s = super().__new__(cls, text)
        s.endpoint = endpoint
        return s


class BusEndpoint:
    """`name` (`tm.push`), `pattern` (`{ns}.traffic_manager.{engine}.push`), message type `msg`
    (a Struct, or a union) and, for request/reply, `reply`."""

    def __init__(self, name: str, pattern: str, msg: Any, reply: Any = None):
        self.name, self.pattern, self.msg, self.reply = name, pattern, msg, reply
        self.params = tuple(f for f in _FIELD.findall(pattern) if f != "ns")
        self._types = (_classes(msg), _items(msg))
        self._reply_types = (_classes(reply), _items(reply)) if reply is not None else ((), ())
        parts = [re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" if p == "ns" else f"(?P<{p}>.+)"  # ns: shortest
                 for i, p in enumerate(_FIELD.split(pattern))]
        self.regex = re.compile("".join(parts) + r"\Z")

    def __repr__(self) -> str:
        return f"BusEndpoint({self.name!r}, {self.pattern!r})"

    def at(self, ns: str, **params: str) -> Subject:
        """This endpoint's subject in mesh `ns`: ValueError naming a missing, extra or bad parameter."""
        if set(params) != set(self.params):
            raise ValueError(f"{self.name}: takes {', '.join(self.params) or 'no parameters'}, got "
                             f"{', '.join(sorted(params)) or 'none'}")
        for key, value in (("ns", ns), *params.items()):
            if not value or _BAD.search(value):
                raise ValueError(f"{self.name}: {key}={value!r} is empty, or holds a wildcard or a space")
        return Subject(self.pattern.format(ns=ns, **params), self)

    def parse(self, subject: str) -> dict[str, str] | None:
        """The parameters (ns among them) `subject` was built with, or None: not this endpoint's."""
        m = self.regex.match(subject)
        return m.groupdict() if m else None

    def check(self, msg: object, subject: str = "") -> None:
        """TypeError naming this endpoint, its type and `msg`'s when `msg` may not be sent on it."""
        if not _fits(msg, *self._types):
            raise TypeError(f"endpoint {self.name} ({subject or self.pattern}) carries {type_name(self.msg)}, "
                            f"not {_given(msg)}")

    def check_reply(self, msg: object) -> None:
        """TypeError when `msg` is no reply of this endpoint (or it takes no requests)."""
        if self.reply is None:
            raise TypeError(f"endpoint {self.name} takes no requests: nothing may reply on it")
        if not _fits(msg, *self._reply_types):
            raise TypeError(f"endpoint {self.name} replies {type_name(self.reply)}, not {_given(msg)}")


def _given(msg: object) -> str:
    if isinstance(msg, list):
        return f"list[{' | '.join(sorted({type(x).__name__ for x in msg}))}]"
    return type(msg).__name__


def _fits(msg: object, classes: tuple[type, ...], items: tuple[type, ...]) -> bool:
    if not isinstance(msg, classes):
        return False
    return not isinstance(msg, list) or all(isinstance(x, items) for x in msg)
