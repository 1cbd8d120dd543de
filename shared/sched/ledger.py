"""Per-engine load figures (tok_e, seq_e) kept up to date as requests move, never recounted."""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

try:  # present where the simulator's core is compiled (dualpath/sim/fast.py); a no-op otherwise
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover
    def mypyc_attr(*_a: object, **_k: object):  # type: ignore[misc,no-redef]
        return lambda cls: cls

Id = Hashable  # an id of a request, engine, node or group: the mesh's strings, the simulator's ints


@dataclass(slots=True)
class Charge:
    """What one request currently puts on its engines (None: no engine on that side)."""

    pe: Hashable | None = None
    pe_tok: int = 0
    de: Hashable | None = None
    de_tok: int = 0


@mypyc_attr(native_class=False)  # an AssertionError: compiled classes cannot derive from it
class LedgerError(AssertionError):
    def __init__(self, role: str, engine: Hashable, counted: tuple[int, int], summed: tuple[int, int]):
        super().__init__(f"{role} engine {engine!r}: counters {counted} != charges {summed}")
        self.role, self.engine, self.counted, self.summed = role, engine, counted, summed


class Ledger:
    def __init__(self) -> None:
        self.charges: dict[Hashable, Charge] = {}  # req id -> its charge
        self._pe: dict[Hashable, list[int]] = {}  # engine -> [tok, seq]
        self._de: dict[Hashable, list[int]] = {}
        self.placed = 0  # requests holding a decode engine (the scheduler's "running")
        self.touched: set[Hashable] = set()  # engines whose counters moved since take_touched()

    # events ---------------------------------------------------------------------------
    def charge_pe(self, req: Hashable, engine: Hashable, tokens: int) -> None:
        c = self._charge(req)
        self._drop_pe(c)
        c.pe, c.pe_tok = engine, tokens
        _add(self._pe, engine, tokens, 1)
        self.touched.add(engine)

    def charge_de(self, req: Hashable, engine: Hashable, tokens: int) -> None:
        c = self._charge(req)
        self._drop_de(c)
        c.de, c.de_tok = engine, tokens
        _add(self._de, engine, tokens, 1)
        self.touched.add(engine)
        self.placed += 1

    def prefill_done(self, req: Hashable) -> None:
        """The request's first token arrived: its prefill engine no longer carries it."""
        c = self.charges.get(req)
        if c is not None:
            self._drop_pe(c)
            self._forget_if_empty(req, c)

    def release(self, req: Hashable) -> None:
        c = self.charges.pop(req, None)
        if c is not None:
            self._drop_pe(c)
            self._drop_de(c)

    # reads ----------------------------------------------------------------------------
    def pe_load(self, engine: Hashable) -> tuple[int, int]:
        """(tok_e, seq_e) of a prefill engine: prompt tokens picked for it, not yet prefilled."""
        tok, seq = self._pe.get(engine, (0, 0))
        return tok, seq

    def de_load(self, engine: Hashable) -> tuple[int, int]:
        """(tok_e, seq_e) of a decode engine: prompt + tokens to generate of the requests it holds."""
        tok, seq = self._de.get(engine, (0, 0))
        return tok, seq

    def take_touched(self) -> set[Hashable]:
        out, self.touched = self.touched, set()
        return out

    def fill(self, lines: Iterable, role: str) -> None:
        """Set `tok` and `seq` of each line (anything with `.engine`) of `role` from the counters."""
        get = (self._pe if role == "prefill" else self._de).get
        for line in lines:
            row = get(line.engine)
            if row is None:
                line.tok = line.seq = 0
            else:
                line.tok, line.seq = row

    def check_integrity(self) -> None:
        for role, table in (("prefill", self._pe), ("decode", self._de)):
            summed: dict[Hashable, list[int]] = {}
            for c in self.charges.values():
                engine, tok = (c.pe, c.pe_tok) if role == "prefill" else (c.de, c.de_tok)
                if engine is not None:
                    _add(summed, engine, tok, 1)
            for engine in set(table) | set(summed):
                row, srow = table.get(engine, [0, 0]), summed.get(engine, [0, 0])
                counted, got = (row[0], row[1]), (srow[0], srow[1])
                if counted != got:
                    raise LedgerError(role, engine, counted, got)
        placed = sum(1 for c in self.charges.values() if c.de is not None)
        if placed != self.placed:
            raise LedgerError("decode", "*", (self.placed, 0), (placed, 0))

    # internals ------------------------------------------------------------------------
    def _charge(self, req: Hashable) -> Charge:
        c = self.charges.get(req)
        if c is None:
            c = self.charges[req] = Charge()
        return c

    def _drop_pe(self, c: Charge) -> None:
        if c.pe is not None:
            _add(self._pe, c.pe, -c.pe_tok, -1)
            self.touched.add(c.pe)
            c.pe, c.pe_tok = None, 0

    def _drop_de(self, c: Charge) -> None:
        if c.de is not None:
            _add(self._de, c.de, -c.de_tok, -1)
            self.touched.add(c.de)
            c.de, c.de_tok = None, 0
            self.placed -= 1

    def _forget_if_empty(self, req: Hashable, c: Charge) -> None:
        if c.pe is None and c.de is None:
            del self.charges[req]


def _add(table: dict[Hashable, list[int]], engine: Hashable, tok: int, seq: int) -> None:
    row = table.get(engine)
    if row is None:
        row = table[engine] = [0, 0]
    row[0] += tok
    row[1] += seq
    if row[1] == 0:  # an engine with nothing charged leaves the table (dead engines do not linger)
        del table[engine]
