"""`dualpath plan ...`: argparse wiring for the planner (no calculations here)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any, Callable

DTYPES = ("fp8", "bf16")


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


pos_int, pos_float = _positive(int), _positive(float)


def _share(text: str) -> float:
    value = pos_float(text) if text not in ("0", "0.0") else 0.0
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # an absent bound
    return obj


def _emit(args: argparse.Namespace, result: Any, text: Callable[[], str]) -> int:
    print(json.dumps(_jsonable(result), indent=2) if args.json else text())
    return 0


def _arch(name: str):
    from dualpath.cli import CliError
    from dualpath.presets import ArchConfigError, load_arch
    try:
        return load_arch(name)
    except ArchConfigError as exc:
        raise CliError(f"--model {name!r}: {exc.why if exc.key == 'model' else exc}") from exc


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn a ValueError from the calculation into a CLI error naming the value."""
    def run(args: argparse.Namespace) -> int:
        from dualpath.cli import CliError
        try:
            return fn(args)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
    return run


def cmd_pd(args: argparse.Namespace) -> int:
    from dualpath.plan import pd, views
    w = pd.window(pd.PDInputs(args.gpus_per_node, args.snic, args.cnic_gbs, args.dram_gbs))
    result: Any = w
    text = views.pd_view(w)
    if args.ratio is not None:
        loads = pd.link_loads(w.inputs, args.ratio)
        result = {"window": w, "ratio": args.ratio, "loads": loads}
        text += "\n" + views.pd_loads_view(w, args.ratio)
    return _emit(args, result, lambda: text)


def cmd_attention(args: argparse.Namespace) -> int:
    from dualpath.plan import attention, views
    inp = attention.AttnInputs(args.cards, args.batch, args.ctx, args.kv_dtype,
                               args.weight_dtype, args.tpot_ms)
    plan = attention.plan_attention(_arch(args.model), inp)
    return _emit(args, plan, lambda: views.attention_view(plan))


def cmd_moe(args: argparse.Namespace) -> int:
    from dualpath.plan import moe, views
    inp = moe.MoEInputs(args.ep, args.batch, args.block_n, args.block_m, args.weight_dtype)
    plan = moe.plan_moe(_arch(args.model), inp)
    return _emit(args, plan, lambda: views.moe_view(plan))


def cmd_capacity(args: argparse.Namespace) -> int:
    from dualpath.plan import capacity, views
    inp = capacity.CapInputs(args.cards, args.hbm, args.ctx, args.attn_tp, args.kv_dtype,
                             args.weight_dtype, args.buffers_gb, args.margin, args.state_mb,
                             args.b_slo, args.concurrency)
    cap = capacity.plan_capacity(_arch(args.model), inp)
    return _emit(args, cap, lambda: views.capacity_view(cap))


def cmd_cp(args: argparse.Namespace) -> int:
    from dualpath.plan import cp, views
    plan = cp.plan_cp(_arch(args.model), cp.CPInputs(args.cards, args.seq, tp=args.tp,
                                                     batch=args.batch))
    return _emit(args, plan, lambda: views.cp_view(plan))


def cmd_pp(args: argparse.Namespace) -> int:
    from dualpath.plan import pp, views
    split = pp.stage_split(args.layers, args.stages, args.tail)
    result: dict[str, Any] = {"stages": split}
    text = views.stage_view(split, args.tail)
    if args.chunks:
        if not args.seq:
            raise ValueError("--chunks needs --seq T")
        chunks = pp.chunk_splits(args.seq, args.chunks, args.attn_share)
        result["chunks"] = chunks
        text += "\n" + views.chunk_view(chunks, args.attn_share)
    return _emit(args, result, lambda: text)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True,
                   help="preset name (ds-v3, ds-v3.2-660b, ds-27b, qwen2.5-32b, llama-3-70b, "
                        "smollm2-135m) or path to a config.json")


def _add(sub: Any, name: str, fn: Callable, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_guard(fn))
    return p


def _register_pd_attention(sub: Any) -> None:
    p = _add(sub, "pd", cmd_pd, "safe P/D node-ratio window (docs/concepts/design.md#the-pd-ratio-window)")
    p.add_argument("--gpus-per-node", type=pos_int, required=True, help="g: GPUs (engines) per node")
    p.add_argument("--snic", type=pos_float, required=True,
                   help="s: a node's total SNIC bandwidth in units of one CNIC's bandwidth")
    p.add_argument("--cnic-gbs", type=pos_float, required=True, help="B: GB/s per CNIC")
    p.add_argument("--dram-gbs", type=pos_float, required=True, help="M: DRAM GB/s per node")
    p.add_argument("--ratio", type=pos_float, help="also show each link's load at this P/D")
    p = _add(sub, "attention", cmd_attention, "attention TP x DP layouts of P cards "
                                              "(docs/concepts/parallelism.md#attention-tp-or-dp)")
    _model_args(p)
    p.add_argument("--cards", type=pos_int, required=True, help="P: cards in the attention domain")
    p.add_argument("--batch", type=pos_int, required=True, help="B: global decode batch")
    p.add_argument("--ctx", type=pos_int, required=True, help="context tokens per request")
    p.add_argument("--kv-dtype", choices=DTYPES, default="fp8", help="KV-cache element type")
    p.add_argument("--weight-dtype", choices=DTYPES, default="fp8", help="weight element type")
    p.add_argument("--tpot-ms", type=pos_float, default=50.0, help="decode step time, ms")


def _register_moe_capacity(sub: Any) -> None:
    p = _add(sub, "moe", cmd_moe, "MoE-TP vs MoE-EP over one domain (docs/concepts/parallelism.md#moe-tp-or-ep)")
    _model_args(p)
    p.add_argument("--ep", type=pos_int, required=True, help="P_EP: the MoE domain size")
    p.add_argument("--batch", type=pos_int, required=True, help="B: tokens per step in the domain")
    p.add_argument("--block-n", type=pos_int, default=128, help="GEMM tile width BN")
    p.add_argument("--block-m", type=pos_int, default=128, help="GEMM tile height BM")
    p.add_argument("--weight-dtype", choices=DTYPES, default="fp8", help="weight element type")
    p = _add(sub, "capacity", cmd_capacity, "usable HBM per card and B_memory "
                                            "(docs/concepts/parallelism.md#memory-capacity-and-batch)")
    _model_args(p)
    p.add_argument("--cards", type=pos_int, required=True, help="P (also the EP size)")
    p.add_argument("--hbm", type=pos_float, required=True, help="HBM per card, GB")
    p.add_argument("--ctx", type=pos_int, default=8192, help="KV tokens per request")
    p.add_argument("--attn-tp", type=pos_int, default=1, help="attention TP degree")
    p.add_argument("--kv-dtype", choices=DTYPES, default="fp8", help="KV-cache element type")
    p.add_argument("--weight-dtype", choices=DTYPES, default="fp8", help="weight element type")
    p.add_argument("--buffers-gb", type=float, default=4.0, help="graphs/comm/scratch per card")
    p.add_argument("--margin", type=float, default=0.05, help="fraction of HBM held back")
    p.add_argument("--state-mb", type=float, default=0.0, help="per-request state besides KV")
    p.add_argument("--b-slo", type=int, default=0, help="batch the latency SLO allows (0: none)")
    p.add_argument("--concurrency", type=int, default=0, help="available requests (0: none)")


def _register_cp_pp(sub: Any) -> None:
    p = _add(sub, "cp", cmd_cp, "context parallelism routes and DCP limits "
                                "(docs/concepts/parallelism.md#context-parallelism-for-long-prefill)")
    _model_args(p)
    p.add_argument("--cards", type=pos_int, required=True, help="N: CP degree")
    p.add_argument("--seq", type=pos_int, required=True, help="T: prefill length")
    p.add_argument("--tp", type=int, default=0, help="decode TP group for DCP (default N)")
    p.add_argument("--batch", type=pos_int, default=1, help="decode batch for DCP traffic")
    p = _add(sub, "pp", cmd_pp, "pipeline stage split and prefill chunk split "
                                "(docs/concepts/parallelism.md#pipeline-parallelism)")
    p.add_argument("--layers", type=pos_int, required=True, help="L: model layers")
    p.add_argument("--stages", type=pos_int, required=True, help="p: pipeline stages")
    p.add_argument("--tail", type=float, default=0.0, help="beta: last-stage tail in stages")
    p.add_argument("--chunks", type=pos_int, help="m: prefill chunks")
    p.add_argument("--attn-share", type=_share, default=1.0, help="a: attention share of time")
    p.add_argument("--seq", type=pos_int, help="T: prefill length (with --chunks)")


def register(subparsers: Any) -> None:
    plan = subparsers.add_parser("plan", help="parallelism planner (P/D window, TP/DP/EP/CP/PP)",
                                 description="Parallelism planner: the method is explained in "
                                             "docs/concepts/parallelism.md, the P/D window in docs/concepts/design.md")
    sub = plan.add_subparsers(dest="plan_command", metavar="WHAT")
    sub.required = True
    _register_pd_attention(sub)
    _register_moe_capacity(sub)
    _register_cp_pp(sub)
