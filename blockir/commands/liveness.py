"""`blockir liveness FILE [--block NAME] [--mode train|infer] [--format json]`: in-place decisions and the
buffer plan of a block and of every block it calls."""
from __future__ import annotations

import argparse
from typing import Any

from blockir.cli import EXIT_OK, add_block_option, add_format_option, print_json, with_callees, with_program
from blockir.ir.program import Block, Program

MODES = ("train", "infer")


def _data(block: Block, plan: Any) -> dict[str, Any]:
    from blockir.ir.printer import format_op
    return {"block": block.name, "kind": block.kind, "mode": plan.mode, "stream": str(plan.stream),
            "adds": [{"op": format_op(d.op), "location": str(d.op.span), "target": d.target, "inplace": d.inplace,
                      "blocked_by": str(d.blocker.span) if d.blocker is not None else None, "kind": d.kind,
                      "reason": d.reason} for d in plan.adds],
            "kept": [{"op": format_op(k.op), "location": str(k.op.span), "values": list(k.values),
                      "state": list(k.state), "why": k.why} for k in plan.kept],
            "buffers": [{"buffer": b, "type": str(plan.types[vs[0]]), "values": list(vs)} for b, vs in plan.shared()],
            "peak": plan.peak, "peak_at": plan.peak_at}


def run(args: argparse.Namespace) -> int:
    def show(program: Program, target: Block) -> int:
        from blockir.analyses.liveness import format_plan, plan
        blocks = with_callees(program, target)
        if args.format == "json":
            print_json([_data(b, plan(b, args.mode)) for b in blocks])
        else:
            print("\n\n".join(format_plan(b, plan(b, args.mode)) for b in blocks))
        return EXIT_OK
    return with_program(args, show)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("liveness", help="which residual adds may write in place, and the buffer plan",
                       description="For every add: whether its result may overwrite the shortcut's storage, or which "
                                   "later read or saved value blocks it; then which values share a buffer and the "
                                   "peak number of live state-sized tensors. Covers the block and every block it "
                                   "calls.")
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
    s.add_argument("--mode", choices=MODES, default="infer",
                   help="train: ops keep what backward needs; infer: nothing is kept (default)")
    add_format_option(s)
    s.set_defaults(func=run)
