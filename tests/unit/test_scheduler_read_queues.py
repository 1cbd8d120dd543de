"""ReadQueues: the scheduler's per-node pending hit reads and its read-path decisions; OracleIndex."""
from __future__ import annotations

import pytest

from services.scheduler.oracle import OracleIndex
from shared.sched.policy.read_path import NEAR_TIE
from shared.sched.reads import PendingReads

pytestmark = pytest.mark.unit
BS = 64


def held(rq: PendingReads, req_id: str, mode: str, blocks: int, pe: str = "nA", de: str = "nB"):
    """Decide and hold, as the scheduler does on assignment."""
    d = rq.decide(mode, blocks, pe, de, BS)
    rq.hold(req_id, d, pe, de, BS)
    return d


def test_no_hit_reads_nothing_and_holds_nothing():
    rq = PendingReads()
    d = held(rq, "r1", "dualpath", 0)
    assert (d.pe_blocks, d.de_blocks, d.reason) == (0, 0, "no hit")
    assert not rq.pending and not rq.held


def test_basic_mode_reads_every_block_on_the_pe_path_however_long_its_queue():
    rq = PendingReads()
    held(rq, "busy", "basic", 100)  # 6400 tokens pending on the PE node
    d = rq.decide("basic", 10, "nA", "nB", BS)
    assert (d.pe_blocks, d.de_blocks, d.path) == (10, 0, "pe")
    assert (d.pe_queue, d.de_queue) == (6400, 0)
    assert "basic" in d.reason


def test_dualpath_split_splits_so_both_queues_drain_together():
    rq = PendingReads()
    rq.pending["nA"] = 100
    d = rq.decide("dualpath-split", 10, "nA", "nB", BS)
    assert (d.pe_blocks, d.de_blocks, d.path) == (4, 6, "split")
    assert (d.pe_queue, d.de_queue) == (100, 0)
    assert "PE 100 + 256" in d.reason and "DE 0 + 384" in d.reason


@pytest.mark.parametrize(("pe_queue", "de_queue", "want"), [(100, 0, (0, 10, "de")), (0, 100, (10, 0, "pe")),
                                                            (0, 0, (10, 0, "pe"))])  # a tie: the PE path
def test_dualpath_reads_every_hit_on_the_shorter_queues_path_where_split_would_split(pe_queue, de_queue, want):
    rq = PendingReads()
    rq.pending.update({"nA": pe_queue, "nB": de_queue})
    d = rq.decide("dualpath", 10, "nA", "nB", BS)
    assert (d.pe_blocks, d.de_blocks, d.path) == want
    assert ("shorter read queue" if pe_queue != de_queue else "equal read queues") in d.reason
    split = rq.decide("dualpath-split", 10, "nA", "nB", BS)
    assert split.pe_blocks and split.de_blocks  # the same queues, the other dualpath mode: both paths


def test_dualpath_sends_everything_to_the_shorter_queue_when_the_other_is_far_behind():
    rq = PendingReads()
    held(rq, "old", "basic", 20)  # 1280 tokens pending on nA
    d = rq.decide("dualpath", 10, "nA", "nB", BS)
    assert (d.pe_blocks, d.de_blocks, d.path) == (0, 10, "de")
    d = rq.decide("dualpath", 10, "nB", "nA", BS)  # roles swapped: nA is now the DE node
    assert (d.pe_blocks, d.de_blocks, d.path) == (10, 0, "pe")


def test_a_decision_sees_the_reads_held_by_earlier_ones():
    rq = PendingReads()
    first = held(rq, "r1", "dualpath-split", 10)
    assert (first.pe_blocks, first.de_blocks) == (5, 5)  # both idle: an even split
    second = rq.decide("dualpath-split", 10, "nA", "nB", BS)
    assert (second.pe_queue, second.de_queue) == (320, 320)


def test_pe_and_de_on_one_node_read_everything_on_one_path_and_say_why():
    rq = PendingReads()
    rq.pending["n0"] = 5000
    d = rq.decide("dualpath", 10, "n0", "n0", BS)
    assert (d.pe_blocks, d.de_blocks, d.path) == (10, 0, "pe")
    assert d.reason == "PE and DE share a node"


def test_reads_on_a_shared_node_are_held_and_released():
    rq = PendingReads()
    held(rq, "r1", "dualpath", 10, pe="n0", de="n0")
    assert rq.pending["n0"] == 640
    rq.done("r1")
    assert not rq.pending


def test_done_returns_pending_to_zero_and_is_harmless_twice():
    rq = PendingReads()
    a = held(rq, "a", "dualpath-split", 10)
    b = held(rq, "b", "dualpath-split", 7)
    assert rq.pending["nA"] == (a.pe_blocks + b.pe_blocks) * BS
    assert rq.pending["nB"] == (a.de_blocks + b.de_blocks) * BS
    rq.done("a")
    rq.done("a")  # a second done (request ended after its prefill) must not touch b's reads
    rq.done("never-held")
    assert dict(rq.pending) == {"nA": b.pe_blocks * BS, "nB": b.de_blocks * BS}
    rq.done("b")
    assert not rq.pending and not rq.held  # no zero entries left behind


def test_a_one_sided_share_holds_and_releases_only_its_node():
    rq = PendingReads()
    rq.pending["nA"] = 10_000  # someone else's reads, not held by a request here
    d = held(rq, "r1", "dualpath", 3)
    assert (d.pe_blocks, d.de_blocks) == (0, 3)
    assert rq.held["r1"] == {"nB": 3 * BS}
    rq.done("r1")
    assert dict(rq.pending) == {"nA": 10_000}


def test_oracle_index_counts_the_stored_prefix_only():
    idx = OracleIndex()
    idx.add(["k0", "k1", "k3"])
    assert idx.hits(["k0", "k1", "k2", "k3"]) == 2  # k3 is stored but follows a miss
    assert idx.hits(["k9", "k0"]) == 0 and idx.hits([]) == 0


@pytest.mark.parametrize("refresh", ["hit", "add"])
def test_oracle_index_evicts_the_least_recently_used_key_beyond_its_bound(refresh):
    idx = OracleIndex(max_keys=3)
    idx.add(["a", "b", "c"])
    if refresh == "hit":
        assert idx.hits(["a"]) == 1
    else:
        idx.add(["a"])
    idx.add(["d"])  # four keys: b is now the least recently used
    assert idx.hits(["b"]) == 0
    assert idx.hits(["a", "c", "d"]) == 3


@pytest.mark.parametrize(("force", "want"), [("pe", (10, 0, "pe")), ("de", (0, 10, "de"))])
def test_the_read_path_setting_puts_every_hit_on_one_path(force, want):
    rq = PendingReads()
    rq.pending["nB"] = 10**6 if force == "de" else 0  # against what the policy would choose
    d = rq.decide("dualpath", 10, "nA", "nB", BS, force=force)
    assert (d.pe_blocks, d.de_blocks, d.path) == want and "read_path setting" in d.reason
    assert rq.decide("basic", 10, "nA", "nB", BS, force="de").path == "pe"  # basic mode stays PE-only


def test_the_read_path_setting_is_checked():
    from shared.config import ConfigError
    from services.scheduler.config import SchedulerConfig

    with pytest.raises(ConfigError, match="read_path"):
        SchedulerConfig(read_path="both").validate()


def test_equal_queues_go_to_the_node_given_fewer_tokens_so_bytes_balance():
    """Queues are often both empty: a tie that always chose the PE path sent every such read
    through the prefill node's storage NIC. Ties alternate by tokens given, and the shorter
    queue still wins wherever the queues differ."""
    rq = PendingReads()
    paths = []
    for i in range(6):  # each read done before the next comes: both queues empty every time
        d = rq.decide("dualpath", 10, "nA", "nB", BS)
        rq.hold(f"r{i}", d, "nA", "nB", BS)
        rq.done(f"r{i}")
        paths.append(d.path)
    assert paths == ["pe", "de"] * 3 and rq.served == {"nA": 3 * 10 * BS, "nB": 3 * 10 * BS}
    rq.pending["nB"] = 1  # a queue differs: the paper's rule, whatever was served
    rq.served["nA"] += 10_000
    assert rq.decide("dualpath", 10, "nA", "nB", BS).path == "pe"


def test_dualpath_near_equal_queues_go_to_the_node_given_fewer_tokens_and_say_so():
    def decide(near: float, de_queue: int):
        rq = PendingReads(near_tie=near)
        rq.pending.update({"nA": 1000, "nB": de_queue})
        rq.served.update({"nA": 0, "nB": 5000})  # the DE node was given more so far
        return rq.decide("dualpath", 10, "nA", "nB", BS)

    assert PendingReads().near_tie == NEAR_TIE
    near = decide(0.25, 800)  # 200 apart, within 25% of 1000
    assert near.path == "pe" and near.reason.startswith("near-equal read queues (within 25%")
    assert "PE 0, DE 5000" in near.reason
    exact = decide(0.0, 800)
    assert exact.path == "de" and exact.reason.startswith("shorter read queue")
    far = decide(0.25, 700)  # 300 apart
    assert far.path == "de" and far.reason.startswith("shorter read queue")
    assert decide(0.25, 1000).reason.startswith("equal read queues")
