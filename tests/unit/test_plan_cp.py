"""Context parallelism plan in exact figures: routes, limits, causal balance, DCP, input errors."""
from __future__ import annotations

import re

import pytest

from dualpath.plan import cp
from dualpath.presets import load_arch

pytestmark = pytest.mark.unit


def test_gqa_routes_exact_traffic_and_activation():
    plan = cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(cards=4, seq=64))  # d = 5120, bf16
    assert plan.model == "qwen2.5-32b"
    assert plan.routes == (
        cp.Route("ring", 491520.0, 983040.0, 81920.0, 163840.0, "none", True),
        cp.Route("ulysses", 245760.0, 491520.0, 81920.0, 163840.0, "N <= H=40, H % N == 0", True),
        cp.Route("all-gather", 245760.0, 491520.0, 327680.0, 655360.0, "none", True),
    )


def test_mla_has_no_ulysses():
    plan = cp.plan_cp(load_arch("ds-v3"), cp.CPInputs(cards=8, seq=64))
    uly = plan.routes[1]
    assert (uly.name, uly.head_limit, uly.allowed) == ("ulysses", "MLA: no head axis", False)
    assert plan.recommended == "ring"


@pytest.mark.parametrize(("cards", "rec"), [(1, "ring"), (2, "ulysses"), (40, "ulysses"), (80, "ring")])
def test_ulysses_needs_two_cards_and_at_most_h(cards, rec):
    plan = cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(cards=cards, seq=4096))  # H = 40
    assert plan.recommended == rec
    assert plan.routes[1].allowed == (cards <= 40)


def test_causal_balance_exact_pairs_as_ints():
    plan = cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(cards=2, seq=8))
    assert plan.balance == (
        cp.Balance("contiguous", (10, 26), 26 * 2 / 36),
        cp.Balance("zigzag", (18, 18), 1.0),
        cp.Balance("interleave", (16, 20), 20 * 2 / 36),
    )
    for b in plan.balance:
        assert all(type(w) is int for w in b.work)  # pair counts print as integers


def test_unknown_scheme_names_the_choices():
    msg = "unknown scheme 'ring' (choose from contiguous, zigzag, interleave)"
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        cp.causal_work(8, 2, "ring")


def test_dcp_gqa_exact():
    d = cp.plan_cp(load_arch("qwen2.5-32b"), cp.CPInputs(cards=4, seq=64, tp=16, batch=3)).dcp
    # n_kv = 8, 40 heads of 128 (+1 LSE for the merge); KV 262144 B/token in bf16
    assert d == cp.DCP(16, 2, "GQA: N <= TP/n_kv = 16/8", 64 * 262144 / 2, 0.5 * 3 * 40 * 128,
                       0.5 * 3 * 40 * 129)


def test_dcp_gqa_degree_rounds_down():
    d = cp.plan_cp(load_arch("llama-3-70b"), cp.CPInputs(cards=4, seq=64, tp=12)).dcp
    assert d.max_degree == 1 and type(d.max_degree) is int


def test_dcp_mla_exact():
    d = cp.plan_cp(load_arch("ds-v3"), cp.CPInputs(cards=8, seq=64)).dcp
    assert d == cp.DCP(8, 8, "MLA: N <= TP=8", 64 * 70272 / 8, 7 / 8 * 128 * 192, 7 / 8 * 128 * 129)


@pytest.mark.parametrize(("kwargs", "msg"), [
    ({"cards": 0, "seq": 8}, "cards must be > 0, got 0"),
    ({"cards": 2, "seq": 0}, "seq must be > 0, got 0"),
    ({"cards": 2, "seq": 8, "batch": -1}, "batch must be > 0, got -1"),
    ({"cards": 2, "seq": 8, "tp": -1}, "tp must be >= 0, got -1"),
])
def test_bad_inputs_name_the_value(kwargs, msg):
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        cp.CPInputs(**kwargs)
