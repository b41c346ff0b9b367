"""``python -m laneflow bench <suite> [--json FILE] [--peers torch,jax,cupy,mlx] [--repeat N] [--quick]``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import laneflow as lf

from .peers import PEERS
from .report import print_results, write_json
from .runner import Context, Progress, run_suites
from .suites import ORDER

SUITE_NAMES = (*ORDER, "all")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmark laneflow against the peers (torch, jax, cupy, mlx)",
                       description="Run a benchmark suite through laneflow (eager 1 lane, eager several lanes, "
                                   "compiled) and every importable peer, in this process; check results "
                                   "agree; print a table and optionally write JSON.")
    p.add_argument("suite", choices=SUITE_NAMES, metavar="suite",
                   help="one of: " + ", ".join(SUITE_NAMES))
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--peers", default=",".join(PEERS), type=_peers,
                   help=f"comma-separated peers to include (default: {','.join(PEERS)}; 'none' for none)")
    p.add_argument("--repeat", type=_positive, default=None, help="timed repeats per row (default 10, quick 5)")
    p.add_argument("--quick", action="store_true", help="tiny sizes that run on the CPU in seconds")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None,
                   help="device to run on (default: the GPU when laneflow can use one, else the CPU)")
    p.add_argument("--lanes", type=_positive, default=None,
                   help="lanes (and peer streams) for the multi-lane rows (default 4 on a GPU, 2+ on the CPU)")
    p.add_argument("--order", choices=("auto", "interleaved", "sequential"), default="auto",
                   help="how a case's rows are timed: taking turns, one sample of each per repeat, so rows "
                        "compare under the same host load (interleaved), or each row's repeats in one go "
                        "(sequential); auto (default): interleaved for gpt2 and decode, whose eager rows "
                        "are host-bound, sequential for the rest")
    p.set_defaults(func=main)


def _peers(text: str) -> list[str]:
    if text.strip().lower() in ("", "none"):
        return []
    names = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(bad)}; choose from {', '.join(PEERS)}")
    return names


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def main(args: argparse.Namespace) -> int:
    if args.device is None:
        device = lf.gpu if lf.gpu_available() else lf.cpu
    else:
        device = lf.Device(args.device)
    lanes = args.lanes or (4 if device.type == "gpu" else max(2, min(4, _cpu_count())))
    repeat = args.repeat or (5 if args.quick else 10)
    ctx = Context(device=device, peers=args.peers, repeat=repeat, quick=args.quick, lanes=lanes,
                  min_sample_s=0.0005 if args.quick else 0.002, progress=Progress(), order=args.order)
    names = list(ORDER) if args.suite == "all" else [args.suite]
    print(f"laneflow {lf.__version__} bench {args.suite} on {device}: {repeat} repeats, {lanes} lanes"
          f"{', quick sizes' if args.quick else ''}; peers: {', '.join(args.peers) or 'none'}")
    results, not_run, ran, in_turns = [], {}, [], []
    for name, rs, why in run_suites(names, ctx):
        if rs is None:
            not_run[name] = why
            print(f"bench {name}: {why} (none usable here); `--quick` runs a tiny CPU version")
            continue
        ran.append(name)
        results.extend(rs)
        if ctx.interleave:
            in_turns.append(name)
            print(f"bench {name}: rows timed taking turns (one sample of each per repeat, each repeat starting one row later, every row"
                  f" running as many times back to back in a sample unless it is slow; --order sequential: one row at a time)")
        print_results(name, rs)
    if ctx.floors is not None and ctx.floors.to_json():
        f = ctx.floors.to_json()
        parts = [f"bandwidth {f['bandwidth_GBps']} GB/s ({f['bandwidth_how']})"] if "bandwidth_GBps" in f else []
        parts += [f"{k[7:-7]} {v} TFLOP/s ({f[k[:-7] + '_how']})" for k, v in f.items() if k.endswith("_TFLOPs")]
        print("floors measured on", device, "this run:", "; ".join(parts))
    if args.json:
        settings = {"suite": args.suite, "peers": list(args.peers), "repeat": repeat, "quick": args.quick,
                    "lanes": lanes, "device": str(device), "order": args.order, "rows_in_turns": in_turns}
        write_json(args.json, suites=ran, not_run=not_run, results=results, device=device, args=settings,
                   floors=ctx.floors)
        print(f"wrote {args.json}")
    bad = [r for r in results if not r.ok]
    for r in bad:
        what = r.error or f"max |diff| {r.max_abs_diff:.3g} over tolerance (rtol {r.rtol})"
        print(f"FAILED {r.suite} / {r.impl}: {what}", file=sys.stderr)
    return 1 if bad else 0


def _cpu_count() -> int:
    return os.cpu_count() or 2
