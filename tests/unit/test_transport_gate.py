"""Cross-link class arbitration (BulkGate): bulk waits for open latency work, never forever."""

import asyncio

import pytest

from shared.transport.classes import CHUNK, ClassSender, DrrScheduler, LinkGate
from shared.transport.gate import BulkGate

pytestmark = pytest.mark.unit
L, B = 0, 1


def test_bulk_is_admitted_at_once_when_no_latency_is_open():
    g = BulkGate((99, 1))
    assert all(g.admit(CHUNK, now=0.0) for _ in range(100))


def test_open_latency_holds_bulk_until_closed():
    g = BulkGate((99, 1), max_hold=1.0)
    g.open()
    assert not g.admit(CHUNK, now=0.0)
    assert not g.admit(CHUNK, now=0.5)
    g.close()
    assert g.admit(CHUNK, now=0.6)


def test_bulk_earns_its_weighted_share_of_latency_bytes():
    g = BulkGate((99, 1), max_hold=1e9)
    g.open()
    g.served(98 * CHUNK)
    assert not g.admit(CHUNK, now=0.0)
    g.served(CHUNK)  # 99 latency chunks served -> one bulk chunk
    assert g.admit(CHUNK, now=0.0)
    assert not g.admit(CHUNK, now=0.0)


def test_a_held_bulk_frame_goes_after_max_hold():
    g = BulkGate((99, 1), max_hold=0.005)
    g.open()
    assert not g.admit(CHUNK, now=1.0)
    assert g.wait_hint(now=1.002) == pytest.approx(0.003)
    assert g.admit(CHUNK, now=1.006)
    assert not g.admit(CHUNK, now=1.007)  # the clock restarts for the next frame


def test_closing_latency_banks_no_credit():
    g = BulkGate((1, 1), max_hold=1e9)
    g.open()
    g.served(10 * CHUNK)
    g.close()
    g.open()
    assert not g.admit(CHUNK, now=0.0)


def test_gate_rejects_bad_weights_and_unbalanced_close():
    with pytest.raises(ValueError):
        BulkGate((1, 0))
    with pytest.raises(RuntimeError):
        BulkGate().close()


def test_push_front_requeues_at_the_head_of_its_class():
    s: DrrScheduler[str] = DrrScheduler((99, 1))
    s.push(B, "b1", 10)
    s.push_front(B, "b0-rest", 5)
    assert s.queued(B) == 2 and s.queued(L) == 0
    assert [s.pop(), s.pop()] == [(B, "b0-rest"), (B, "b1")]


def test_sender_holds_bulk_while_latency_is_open_and_releases_held_items():
    async def main() -> tuple[list[str], list[str], int]:
        seen: list[str] = []
        gate = LinkGate((99, 1))
        gate.policy.max_hold = 1e9

        async def emit(batch: list[str]) -> None:
            seen.extend(batch)

        sender: ClassSender[str] = ClassSender(emit, (99, 1), gate=gate)
        task = asyncio.get_running_loop().create_task(sender.run())
        gate.open()  # e.g. a latency transfer on another link
        sender.submit(B, "b0", CHUNK)
        sender.submit(L, "l0", 100, hold=True)
        for _ in range(20):
            await asyncio.sleep(0)
        before = list(seen)
        gate.close()
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return before, seen, gate.policy.open_count

    before, after, still_open = asyncio.run(main())
    assert "b0" not in before and after[-1] == "b0"
    assert still_open == 0
