"""The request journal: which requests a scheduler accepted and which it finished, on JetStream.

A restarted scheduler cancels what it accepted and never finished. Writing is best effort and
never blocks the request path; only `ensure()` raises."""
from __future__ import annotations

import asyncio
import datetime
import logging
import re
import time
from typing import Awaitable, Callable

import msgspec
import nats
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from shared.messages.endpoints import EP, journal_subjects
from shared.messages.journal import Accepted, Entry, Finished

log = logging.getLogger("scheduler.journal")


BATCH = 256  # most records one batch message holds (~40 KB)
LINGER_S = 0.05  # the writer waits this long after a record for more to join it (each write is a round trip)
RECORDS = {"accepted": EP.JOURNAL_ACCEPTED, "finished": EP.JOURNAL_FINISHED, "batch": EP.JOURNAL_BATCH}
_encoder = msgspec.json.Encoder()  # JSON: readable with `nats stream view` when debugging a restart
_decoder = msgspec.json.Decoder(Entry | list[Entry])


def encode(entry: Entry | list[Entry]) -> bytes:
    return _encoder.encode(entry)


def decode(data: bytes) -> Entry | list[Entry]:
    return _decoder.decode(data)


def fold(entries) -> list[Accepted]:
    """Accepted minus finished, in acceptance order; a `Finished` may precede its `Accepted`."""
    accepted: dict[str, Accepted] = {}
    finished: set[str] = set()
    for e in entries:
        if isinstance(e, Accepted):
            accepted.setdefault(e.req_id, e)
        else:
            finished.add(e.req_id)
    return [a for rid, a in accepted.items() if rid not in finished]


def stream_name(namespace: str) -> str:
    return f"DP_{re.sub(r'[^A-Za-z0-9_-]', '_', namespace)}_REQUESTS"


class JournalUnavailable(RuntimeError):
    """The server cannot hold the journal (JetStream not enabled, or no reply): run without one."""

    def __init__(self, server: str, reason: str):
        super().__init__(f"request journal unavailable on {server}: {reason}")
        self.server, self.reason = server, reason


class JournalError(RuntimeError):
    def __init__(self, stream: str, reason: str):
        super().__init__(f"{stream}: {reason}")
        self.stream, self.reason = stream, reason


class Journal:
    def __init__(self, nc: nats.NATS, namespace: str, *, max_age_s: float = 24 * 3600,
                 max_msgs: int = 1_000_000, duplicate_window_s: float = 120.0, timeout_s: float = 1.0,
                 linger_s: float = LINGER_S):
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=timeout_s)
        self.stream = stream_name(namespace)
        self.ns = namespace
        self.max_age_s, self.max_msgs, self.duplicate_window_s = max_age_s, max_msgs, duplicate_window_s
        self.timeout_s, self.linger_s = timeout_s, linger_s
        self.failures = 0  # records that could not be written (NATS down, stream gone, queue full)
        self.queue: asyncio.Queue[tuple[str, str, Entry, str]] = asyncio.Queue(maxsize=10_000)

    async def ensure(self) -> None:
        cfg = StreamConfig(name=self.stream, subjects=[journal_subjects(self.ns)], storage=StorageType.FILE,
                           max_age=self.max_age_s, max_msgs=self.max_msgs,
                           duplicate_window=self.duplicate_window_s)
        server = self.nc.connected_url.netloc if self.nc.connected_url else "?"
        try:
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError:  # exists with another configuration
                await self.js.update_stream(cfg)
        except nats.js.errors.ServiceUnavailableError:
            raise JournalUnavailable(server, "JetStream is not enabled (start nats-server with -js)") from None
        except (nats.errors.TimeoutError, nats.js.errors.APIError) as exc:
            raise JournalUnavailable(server, f"{type(exc).__name__}: {exc}") from None

    async def accepted(self, req_id: str, record: Accepted) -> bool:
        return await self._write("accepted", req_id, record, req_id)

    async def finished(self, req_id: str, status: str, tokens: int) -> bool:
        rec = Finished(req_id, status, tokens, time.time())
        return await self._write("finished", req_id, rec, req_id + ":finished")

    def note_accepted(self, record: Accepted) -> None:
        self._note(("accepted", record.req_id, record, record.req_id))

    def note_finished(self, req_id: str, status: str, tokens: int) -> None:
        self._note(("finished", req_id, Finished(req_id, status, tokens, time.time()), req_id + ":finished"))

    def _note(self, item: tuple[str, str, Entry, str]) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.failures += 1
            log.warning("journal queue full: %s %s not recorded", item[0], item[1])

    async def run(self) -> None:
        """The writer: queued records in order, alone or batched; runs until cancelled."""
        while True:
            items = [await self.queue.get()]
            if self.linger_s > 0:
                await asyncio.sleep(self.linger_s)
            while len(items) < BATCH and not self.queue.empty():
                items.append(self.queue.get_nowait())
            if len(items) == 1:
                await self._write(*items[0])
            else:
                await self._write("batch", f"{items[0][1]} and {len(items) - 1} more", [e for _, _, e, _ in items],
                                  None, len(items))

    async def _write(self, verb: str, req_id: str, entry: Entry | list[Entry], msg_id: str | None,
                     records: int = 1) -> bool:
        endpoint = RECORDS[verb]
        endpoint.check(entry)
        try:
            await self.js.publish(endpoint.at(self.ns), encode(entry),
                                  headers={"Nats-Msg-Id": msg_id} if msg_id else None)
            return True
        except Exception as exc:  # noqa: BLE001 - best effort: a journal write never fails a request
            self.failures += records
            log.warning("journal %s %s not recorded: %s", verb, req_id, type(exc).__name__)
            return False

    async def unfinished(self, since: float | None = None, scheduler: str | None = None) -> list[Accepted]:
        """Requests accepted (since `since`, by `scheduler`) with no `finished` record. Schedulers sharing
        a stream need stable instances, or a restarted one cancels its peers' work."""
        cfg = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0)
        if since is not None:
            cfg.deliver_policy = DeliverPolicy.BY_START_TIME
            cfg.opt_start_time = datetime.datetime.fromtimestamp(since, datetime.timezone.utc)
        try:
            sub = await self.js.subscribe(journal_subjects(self.ns), stream=self.stream, ordered_consumer=True,
                                          config=cfg)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise JournalError(self.stream, f"cannot open a consumer: {type(exc).__name__}: {exc}") from None
        entries: list[Entry] = []
        try:
            info = await sub.consumer_info()
            if info.num_pending == 0 and info.delivered.consumer_seq == 0:
                return []
            while True:
                msg = await sub.next_msg(timeout=max(self.timeout_s, 2.0))
                try:
                    got = decode(msg.data)
                    entries += got if isinstance(got, list) else [got]
                except msgspec.DecodeError as exc:  # a bad record is logged and skipped
                    log.warning("journal: skipped bad record %s: %s", msg.metadata.sequence.stream, exc)
                if msg.metadata.num_pending == 0:
                    break
        except nats.errors.TimeoutError:
            raise JournalError(self.stream, f"read stalled after {len(entries)} records") from None
        finally:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass
        return [r for r in fold(entries) if (since is None or r.accepted_at >= since)
                and (scheduler is None or r.scheduler == scheduler)]


async def cancel_lost(journal: Journal, live: set[str], cancel: Callable[[str, str], Awaitable[None]],
                      attempts: int) -> int:
    """Cancel every attempt of the requests an earlier life accepted and never answered, and journal
    them finished; the `live` peers' are theirs. Raises JournalError when unreadable."""
    lost = [a for a in await journal.unfinished() if a.scheduler not in live]
    for acc in lost:
        for attempt in range(attempts):
            await cancel(f"{acc.req_id}#{attempt}", "scheduler restarted")
        journal.note_finished(acc.req_id, "error", 0)
    return len(lost)


async def recover(journal: Journal, live: Callable[[], set[str]], cancel: Callable[[str, str], Awaitable[None]],
                  attempts: int, wait_s: float) -> int:
    """`cancel_lost` once `wait_s` has passed; returns how many (0 when the journal is unreadable)."""
    await asyncio.sleep(wait_s)
    try:
        n = await cancel_lost(journal, live(), cancel, attempts)
    except JournalError as exc:
        log.warning("journal not read, nothing recovered: %s", exc)
        return 0
    if n:
        log.warning("%d requests left unfinished by a previous scheduler: cancelled, counted failed", n)
    return n
