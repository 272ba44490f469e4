"""`blockir run FILE`: the main job — build with built-in branches, train a few steps, print telemetry."""
from __future__ import annotations

import argparse
import sys
import time

from blockir.api import read_source
from blockir.cli import EXIT_ERRORS, EXIT_OK, EXIT_USAGE, emit, with_program
from blockir.diagnostics import BlockError
from blockir.ir.program import Block, Program

DEFAULT_ROW_DIMS = {"batch": 2, "seq": 16}


def parse_dims(text: str | None) -> dict[str, int]:
    """'B=2,S=16' → {'B': 2, 'S': 16}; raises ValueError with a readable message."""
    out: dict[str, int] = {}
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit() or int(value) <= 0:
            raise ValueError(f"bad --dims entry '{item}'; expected NAME=POSITIVE_INT")
        out[name.strip()] = int(value)
    return out


def default_block(program: Program) -> Block:
    """The last model of the file, else its last block: the outermost thing it describes."""
    models = [b for b in program.blocks if b.kind == "model"]
    return (models or list(program.blocks))[-1]


def _fmt(values: tuple[float, ...]) -> str:
    return "".join(f"{v:>9.4f}" for v in values)


def run(args: argparse.Namespace) -> int:
    def job(program: Program, blocks: list[Block]) -> int:
        from blockir.backends.session import RunConfig, run_session
        try:
            dims = parse_dims(args.dims)
        except ValueError as exc:
            print(f"blockir: {exc}", file=sys.stderr)
            return EXIT_USAGE
        block = blocks[0] if args.block else default_block(program)
        for d in program.dims:
            if d.size is None and d.name not in dims:
                dims[d.name] = DEFAULT_ROW_DIMS.get(d.role.value, 8)
        cfg = RunConfig(steps=args.steps, seed=args.seed, lr=args.lr, dims=dims)
        start = time.perf_counter()
        try:
            report = run_session(program, block, cfg, log=lambda line: print(line, flush=True))
        except BlockError as exc:  # sizes known only now: the budget, heads against the width
            emit(exc.diagnostics, {args.file: read_source(args.file)})
            return EXIT_ERRORS
        print()
        print(f"{'site':<28}{'rho p50':>9}{'rho p90':>9}{'rho p99':>9}{'cos p50':>9}{'cos p90':>9}{'cos p99':>9}")
        for s in report.sites:
            print(f"{s.site:<28}{_fmt(s.rho)}{_fmt(s.cos)}")
        print(f"\n{len(report.sites)} residual sites; rho = RMS(update)/RMS(state), cos = cosine(state, update), "
              f"quantiles over {report.rows} rows; {time.perf_counter() - start:.2f} s")
        if args.plot:
            from blockir.backends.plot import plot_sites
            plot_sites(report.sites, args.plot, title=f"{program.filename}: {block.name}")
            print(f"wrote {args.plot}")
        return EXIT_OK
    return with_program(args, job)


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="build with built-in branches, train a few steps on random data, print telemetry")
    r.add_argument("file", metavar="FILE")
    r.add_argument("--block", help="block or model to run (default: the last model in the file)")
    r.add_argument("--dims", help="sizes, e.g. B=2,S=16,D=64 (dims without a size default to B=2, S=16)")
    r.add_argument("--steps", type=int, default=1, help="training steps (forward, backward, AdamW update)")
    r.add_argument("--seed", type=int, default=0, help="seed for initialisation, data and dropout")
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--plot", metavar="FILE.png", help="draw rho and cos against depth (needs matplotlib)")
    r.set_defaults(func=run)
