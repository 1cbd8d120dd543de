"""MeshView: the live mesh from announcements only, with an injected clock."""
from __future__ import annotations

import typing

import msgspec

import pytest

from services.scheduler.view import MeshView
from shared.messages.registry import EngineAnnounce, StorageGatewayAnnounce, SchedulerAnnounce, TrafficManagerAnnounce

pytestmark = pytest.mark.unit

# the KV memory layout struct the engine announces (found from the field's type, not by name)
KV = next(a for a in typing.get_args(typing.get_type_hints(EngineAnnounce)["kv"]) if a is not type(None))


def kv():
    return KV("shm-x", 16, 8, 2, 1024, 512)


def eng(eid: str, role: str = "prefill", *, with_kv: bool = True, leaving: bool = False, **kw) -> EngineAnnounce:
    return EngineAnnounce(f"inst-{eid}", "n0", engine=eid, role=role, kv=kv() if with_kv else None,
                          leaving=leaving, **kw)


def tm(eid: str, ready: bool = True, leaving: bool = False) -> TrafficManagerAnnounce:
    return TrafficManagerAnnounce(f"tm-{eid}", "n0", engine=eid, ready=ready, leaving=leaving)


def mesh(*msgs, at: float = 0.0, timeout: float = 3.0) -> MeshView:
    view = MeshView(timeout_s=timeout)
    for m in msgs:
        view.update(m, at)
    return view


def ids(anns) -> list[str]:
    return [a.engine for a in anns]


def test_engine_with_ready_tm_and_kv_is_assignable():
    view = mesh(eng("p0"), tm("p0"))
    assert ids(view.assignable("prefill", 1.0)) == ["p0"]


def test_assignable_filters_by_role():
    view = mesh(eng("p0"), tm("p0"), eng("d0", "decode"), tm("d0"))
    assert ids(view.assignable("prefill", 0)) == ["p0"]
    assert ids(view.assignable("decode", 0)) == ["d0"]


def test_assignable_is_sorted_by_engine_id():
    view = mesh(eng("p2"), tm("p2"), eng("p0"), tm("p0"), eng("p1"), tm("p1"))
    assert ids(view.assignable("prefill", 0)) == ["p0", "p1", "p2"]


def test_engine_without_its_tm_is_not_assignable():
    assert mesh(eng("p0")).assignable("prefill", 0) == []


def test_engine_whose_tm_is_not_ready_is_not_assignable():
    assert mesh(eng("p0"), tm("p0", ready=False)).assignable("prefill", 0) == []


def test_engine_without_kv_layout_is_not_assignable():
    assert mesh(eng("p0", with_kv=False), tm("p0")).assignable("prefill", 0) == []


def test_tm_of_another_engine_does_not_count():
    assert mesh(eng("p0"), tm("p1")).assignable("prefill", 0) == []


def test_liveness_boundary_is_inclusive():
    view = mesh(eng("p0"), tm("p0"), at=10.0, timeout=3.0)
    assert ids(view.assignable("prefill", 13.0)) == ["p0"]
    assert view.assignable("prefill", 13.01) == []


def test_silent_tm_makes_engine_unassignable_and_dead():
    view = mesh(eng("p0"), tm("p0"), at=0.0)
    view.update(eng("p0"), 5.0)  # engine keeps beating; TM went silent at 0
    assert view.assignable("prefill", 5.0) == []
    assert view.dead_engines(5.0) == ["p0"]


def test_heartbeat_refreshes_liveness():
    view = mesh(eng("p0"), tm("p0"), at=0.0)
    view.update(eng("p0"), 2.5)
    view.update(tm("p0"), 2.5)
    assert ids(view.assignable("prefill", 5.0)) == ["p0"]
    assert view.dead_engines(5.0) == []


def test_latest_announcement_replaces_the_previous_one():
    view = mesh(eng("p0"), tm("p0"))
    view.update(tm("p0", ready=False), 1.0)
    assert view.assignable("prefill", 1.0) == []
    view.update(eng("p0", max_context=77), 1.0)
    assert view.max_context() == 77


def test_leaving_engine_is_dropped_at_once():
    view = mesh(eng("p0"), tm("p0"))
    view.update(eng("p0", leaving=True), 0.5)
    assert "p0" not in view.engines
    assert view.assignable("prefill", 0.5) == []
    assert view.dead_engines(100.0) == []  # gone, not dead: nothing left to fail


def test_leaving_tm_is_dropped_and_engine_becomes_unassignable():
    view = mesh(eng("p0"), tm("p0"))
    view.update(tm("p0", leaving=True), 0.5)
    assert "p0" not in view.tms
    assert view.assignable("prefill", 0.5) == []


def test_leaving_for_unknown_process_is_harmless():
    view = mesh()
    view.update(eng("zz", leaving=True), 0)
    view.update(StorageGatewayAnnounce("g", "n9", leaving=True), 0)
    assert view.engines == {} and view.gateways == {}


def test_dead_engines_lists_silent_engines_sorted_once():
    view = mesh(eng("p1"), tm("p1"), eng("p0"), tm("p0"), at=0.0)
    view.update(eng("p2"), 9.0)
    view.update(tm("p2"), 9.0)
    assert view.dead_engines(10.0) == ["p0", "p1"]  # engine and TM both silent: listed once


def test_silent_tm_of_unknown_engine_is_not_reported():
    assert mesh(tm("ghost"), at=0.0).dead_engines(100.0) == []


def test_engine_that_never_had_a_tm_is_not_dead_while_beating():
    assert mesh(eng("p0"), at=0.0).dead_engines(1.0) == []


def test_forget_drops_engine_and_its_tm():
    view = mesh(eng("p0"), tm("p0"), eng("p1"), tm("p1"))
    view.forget("p0")
    assert "p0" not in view.engines and "p0" not in view.tms
    assert view.dead_engines(100.0) == ["p1"]
    view.forget("never-seen")  # harmless


def test_gateways_are_keyed_by_node_and_schedulers_by_instance():
    view = mesh(StorageGatewayAnnounce("g1", "node-a"), StorageGatewayAnnounce("g2", "node-b"),
                SchedulerAnnounce("s1", "node-a"), SchedulerAnnounce("s2", "node-a"))
    assert sorted(view.gateways) == ["node-a", "node-b"]
    assert sorted(view.schedulers) == ["s1", "s2"]
    assert view.engines == {} and view.tms == {}


def test_model_ids_are_distinct_sorted_and_skip_blank():
    view = mesh(eng("p0", model_id="m-b"), eng("p1", model_id="m-a"), eng("d0", "decode", model_id="m-b"),
                eng("d1", "decode"))
    assert view.model_ids() == ["m-a", "m-b"]


def test_max_context_is_the_smallest_announced_and_ignores_zero():
    view = mesh(eng("p0", max_context=4096), eng("d0", "decode", max_context=2048), eng("d1", "decode"))
    assert view.max_context() == 2048


def test_max_context_is_zero_with_no_engines():
    assert MeshView().max_context() == 0 and MeshView().model_ids() == []


def test_update_says_when_an_announcement_changes_what_dispatch_uses():
    view = MeshView(timeout_s=3.0)
    assert view.update(eng("p0"), 0.0)  # new
    assert not view.update(eng("p0"), 0.5)  # a heartbeat
    assert view.update(eng("p0", total_blocks=7), 1.0)  # its KV size moved
    assert view.update(eng("p0", total_blocks=7), 5.0)  # back after going silent
    assert view.update(tm("p0"), 5.0) and not view.update(tm("p0"), 5.5) and view.update(tm("p0", ready=False), 6)
    assert view.update(eng("p0", leaving=True), 6.0) and not view.update(eng("p0", leaving=True), 6.1)


def test_assignable_list_is_kept_while_engines_heartbeat_and_exact_when_one_goes_silent():
    view = mesh(eng("p0"), tm("p0"), eng("p1"), tm("p1"))
    first = view.assignable("prefill", 0.0)
    for t in (0.5, 1.0, 2.5, 3.0, 4.5):  # past the first expiry: a rescan finds both still there
        for m in (eng("p0"), tm("p0"), eng("p1"), tm("p1")):
            view.update(m, t)
        assert view.assignable("prefill", t) is first and ids(first) == ["p0", "p1"]
    view.update(eng("p0"), 6.0)
    view.update(tm("p0"), 6.0)
    assert ids(view.assignable("prefill", 7.6)) == ["p0"]  # p1 silent since 4.5


def test_an_engine_or_tm_back_as_a_new_process_is_reported_restarted_once():
    view = mesh(eng("e0"), tm("e0"), eng("e1"), tm("e1"))
    view.update(eng("e0"), 0.5)  # a heartbeat of the same process
    view.update(tm("e1"), 0.5)
    assert view.take_restarted() == []
    view.update(msgspec.structs.replace(eng("e0"), instance="inst-e0-again"), 1.0)  # within the timeout
    view.update(msgspec.structs.replace(tm("e1"), instance="tm-e1-again"), 1.0)
    view.update(msgspec.structs.replace(eng("e0"), instance="inst-e0-again"), 1.2)
    assert view.take_restarted() == ["e0", "e1"]
    assert view.take_restarted() == []
    assert ids(view.assignable("prefill", 1.5)) == ["e0", "e1"]  # the new processes serve


def test_an_engine_whose_attempt_failed_waits_until_its_engine_and_tm_both_speak_again():
    view = mesh(eng("e0"), tm("e0"), eng("e1"), tm("e1"))
    view.suspect(["e0", ""], 1.0)
    assert ids(view.assignable("prefill", 1.0)) == ["e1"]
    view.update(eng("e0"), 1.5)  # the engine speaks; its TM (dead, say) does not
    assert ids(view.assignable("prefill", 1.6)) == ["e1"]
    view.update(tm("e0"), 1.7)
    assert ids(view.assignable("prefill", 1.8)) == ["e0", "e1"]
