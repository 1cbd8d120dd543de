"""Text views of planner results: one function per subcommand, result -> str; wording only."""
from __future__ import annotations

from dualpath.plan.attention import AttnPlan
from dualpath.plan.capacity import Capacity
from dualpath.plan.cp import CPPlan
from dualpath.plan.moe import MoEPlan
from dualpath.plan.pd import PDWindow, link_loads
from dualpath.plan.pp import ChunkSplit, StageSplit
from dualpath.plan.table import fmt, pairs, render, size


def pd_view(w: PDWindow) -> str:
    i = w.inputs
    head = (f"P/D window: g={i.gpus_per_node} GPUs/node, SNIC s={fmt(i.snic)} x B, "
            f"B={fmt(i.cnic_gbs)} GB/s per CNIC, M={fmt(i.dram_gbs)} GB/s DRAM per node")
    rows = [("lower", "PE CNIC write", "P/D >= s/(g-s)", w.lower.ratio, "binds")]
    formulas = {"DE CNIC read": "P/D <= (g-2s)/s", "DE CNIC write": "P/D <= (g-s)/(2s)",
                "DE DRAM": "P/D <= (M/(B*s)-3)/2"}
    rows += [("upper", b.link, formulas[b.link], b.ratio, "binds" if b in w.binding else "")
             for b in w.uppers]
    out = [head, render(["end", "link", "inequality", "bound", ""], rows)]
    if not w.pe_read_ok:
        out.append(f"PE CNIC read needs 2s <= g: 2*{fmt(i.snic)} > {i.gpus_per_node}: no safe window")
    elif not w.feasible:
        out.append(f"empty window: lower {fmt(w.lower.ratio)} > upper {fmt(w.upper.ratio)}")
    else:
        out.append(f"safe window: {fmt(w.lower.ratio)} <= P/D <= {fmt(w.upper.ratio)}"
                   f"  (lower end bound by {w.lower.link}, upper end by "
                   f"{' and '.join(b.link for b in w.binding)})")
        out.append("node ratios inside (P,D <= 4): " + ", ".join(w.examples))
    return "\n".join(out)


def pd_loads_view(w: PDWindow, ratio: float) -> str:
    loads = link_loads(w.inputs, ratio)
    rows = [(k, v, "OVER" if v > 1 + 1e-9 else "ok") for k, v in loads.items()]
    return render(["link", "load/capacity", ""], rows, title=f"link loads at P/D = {fmt(ratio)}")


def attention_view(p: AttnPlan) -> str:
    i = p.inputs
    head = [(f"attention layouts: {p.model} ({'MLA' if p.mla else 'GQA'}) on {i.cards} cards, "
             f"batch {i.batch}, ctx {i.ctx}, KV {i.kv_dtype}, weights {i.weight_dtype}"),
            (f"KV/token {size(p.kv_bytes_per_token)}, KV total {size(p.kv_total_bytes)}, "
             f"attention weights {size(p.attn_weight_bytes)}")]
    rows = [(f"TP{x.tp}xDP{x.dp}", x.kv_copies, size(x.kv_bytes_per_card), x.kv_read_gbs,
             size(x.weight_bytes_per_card), size(x.total_bytes_per_card), x.layout_comm_bd,
             x.moe_a2a_bd, x.attn_tokens_per_card,
             ("*" if x.tp == p.recommended_tp else "") + ("" if x.allowed else " x " + x.note))
            for x in p.layouts]
    table = render(["layout", "KV copies", "KV/card", "KV read GB/s", "attn W/card",
                    "W+KV/card", "layout comm (B*d)", "MoE a2a (B*d)", "attn tok/card", ""], rows)
    tail = [f"KV read GB/s = KV/card read once per decode step of {fmt(i.tpot_ms)} ms; "
            "comm per card per layer; attention compute per card = B/P in every layout."]
    if p.mla:
        tail.append(f"sqrt rule: TP* = sqrt(W * P / KV_total) = {p.tp_star:.2f}; "
                    f"recommended TP{p.recommended_tp} (least W+KV/card); "
                    f"within 10%: TP {', '.join(map(str, p.near_best_tps))}")
    else:
        tail.append(f"GQA rule: TP <= n_kv = {int(p.tp_star)} (KV split by heads); "
                    f"recommended TP{p.recommended_tp} (least W+KV/card); "
                    f"within 10%: TP {', '.join(map(str, p.near_best_tps))}")
    return "\n".join(head + [table] + tail)


def moe_view(p: MoEPlan) -> str:
    i = p.inputs
    head = (f"MoE: {p.model}, E={p.experts}, k={p.top_k}, N={p.n_inter}, domain P={i.ep}, "
            f"batch B={i.batch} tokens (B_local={fmt(p.tokens_per_card)})")
    rows = [
        ("communication (EP / TP bytes)", 1.0, p.comm_ratio),
        ("N per card", p.tp_n_per_card, p.n_inter),
        (f"N-tile fill at BN={i.block_n}", p.tp_tile_fill, p.ep_tile_fill),
        ("experts held per card", p.experts, p.experts_per_card_ep),
        ("expected experts hit per card", p.experts_hit, p.experts_hit_per_card_ep),
        ("expected expert bytes read/card", size(p.expert_read_bytes_per_card),
         size(p.expert_read_bytes_per_card)),
        ("activation per card [rows, d]", size(p.act_bytes_per_card_tp), size(p.act_bytes_per_card_ep)),
        ("rows per expert M_e", p.rows_per_expert, p.rows_per_expert),
    ]
    table = render(["", f"MoE-TP{i.ep}", f"MoE-EP{i.ep}"], rows)
    tail = [f"r = k/P_EP = {p.top_k}/{i.ep} = {p.comm_ratio:.3f}"
            + ("  (EP domain <= k: no communication advantage)" if p.comm_ratio >= 1 else ""),
            f"u(B) = E*(1-exp(-B*k/E)) = {p.experts_hit:.1f} of {p.experts} experts",
            f"EP size whose M_e fills BM={i.block_m} at this B_local: P ~ BM*E/(k*B_local) "
            f"= {p.ep_for_full_m_tile:.0f}",
            "rule: up to ~8 cards MoE-TP loses nothing; beyond, EP (with EPLB)."]
    return "\n".join([head, table] + tail)


def capacity_view(c: Capacity) -> str:
    i = c.inputs
    head = (f"capacity: {c.model} on {i.cards} cards x {fmt(i.hbm_gb)} GB HBM, attention TP{i.attn_tp}, "
            f"EP{i.cards}, weights {i.weight_dtype}, KV {i.kv_dtype}, ctx {i.ctx}")
    rows = [(f"weights: {k}", size(v)) for k, v in c.weights_by_part.items()]
    rows += [("weights on card", size(c.weights_per_card)), ("buffers", size(c.buffers)),
             ("margin", size(c.margin)), ("usable for KV + state", size(c.usable)),
             ("KV per request on card", size(c.kv_per_request)),
             ("state per request", size(c.state_per_request)),
             (f"B_memory per attention group ({i.attn_tp} card(s))", fmt(c.b_memory_per_group)),
             ("B_memory in the domain", c.b_memory), ("B_run = min(B_memory, B_SLO, concurrency)", c.b_run)]
    out = [head, pairs(rows)]
    if not c.fits:
        out.append("does NOT fit: weights + buffers + margin exceed HBM")
    return "\n".join(out)


def cp_view(p: CPPlan) -> str:
    i = p.inputs
    head = f"context parallelism: {p.model}, N={i.cards} cards, T={i.seq} tokens, act {i.act_dtype}"
    rows = [(r.name, size(r.comm_bytes), size(r.act_bytes), r.head_limit,
             ("yes" if r.allowed else "no") + (" *" if r.name == p.recommended else ""))
            for r in p.routes]
    routes = render(["route", "comm/card/layer", "activation/card", "head limit", "usable"], rows)
    bal = render(["partition", "max/mean causal work", "per-card work"],
                 [(b.scheme, b.max_over_mean, " ".join(fmt(w) for w in b.work[:8])
                   + (" ..." if len(b.work) > 8 else "")) for b in p.balance])
    d = p.dcp
    dcp = pairs([("DCP limit", d.limit), ("max DCP degree", d.max_degree),
                 ("KV/card, one request (bf16)", size(d.kv_bytes_per_card_bf16)),
                 ("Q all-gather per step/card (elems)", d.q_gather_elems),
                 ("out+LSE merge per step/card (elems)", d.merge_elems)],
                title=f"decode context parallelism (TP group {d.tp}, batch {i.batch}):")
    rec = f"recommended: {p.recommended} with a {p.partition} partition"
    return "\n".join([head, routes, rec, bal, dcp])


def stage_view(s: StageSplit, tail: float) -> str:
    rows = [(k, n, t) for k, (n, t) in enumerate(zip(s.layers, s.times))]
    return "\n".join([
        render(["stage", "layers", "time (layer units)"], rows,
               title=f"stage split ({sum(s.layers)} layers, {len(s.layers)} stages, tail beta={fmt(tail)})"),
        f"max/mean stage time {s.max_over_mean:.3f} (even split: {s.naive_max_over_mean:.3f})"])


def chunk_view(splits: tuple[ChunkSplit, ...], share: float) -> str:
    m = len(splits[0].sizes)
    rows = [[k] + [x for c in splits for x in (c.sizes[k], c.times[k])] for k in range(m)]
    rows.append(["max/mean"] + [x for c in splits for x in ("", c.max_over_mean)])
    heads = ["chunk"] + [h for c in splits for h in (f"{c.name} len", f"{c.name} t")]
    note = "s_k = T*sqrt(k/m) equalises attention; equal-time solves (1-a)x + a x^2 = k/m"
    return "\n".join([render(heads, rows, title=f"chunk split (attention share a={fmt(share)})"), note])
