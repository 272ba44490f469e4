"""`blockir run FILE`: the main job — build with built-in branches, train a few steps, print telemetry.

The telemetry table (or JSON) is the report, on stdout; the run's progress goes to stderr.
"""
from __future__ import annotations

import argparse
import time

from blockir.cli import (EXIT_OK, add_block_option, add_dims_option, add_format_option, log, print_json,
                         with_callees, with_program)
from blockir.ir.decls import ExternDecl
from blockir.ir.program import Block, Program

DEFAULT_ROW_DIMS = {"batch": 2, "seq": 16}


def _fmt(values: tuple[float, ...]) -> str:
    return "".join(f"{v:>9.4f}" for v in values)


def run(args: argparse.Namespace) -> int:
    def job(program: Program, block: Block) -> int:
        from blockir.backends.session import RunConfig, run_session
        dims = dict(args.dims)
        for d in program.dims:
            if d.size is None and d.name not in dims:
                dims[d.name] = DEFAULT_ROW_DIMS.get(d.role.value, 8)
        externs = [f"{b.name}.{d.name}" for b in with_callees(program, block) for d in b.decls
                   if isinstance(d, ExternDecl)]
        if externs:
            log(f"blockir: externs replaced by linear stand-ins (a Linear of their first input; bind real modules "
                f"with blockir.compile): {', '.join(externs)}")
        cfg = RunConfig(steps=args.steps, seed=args.seed, lr=args.lr, dims=dims)
        start = time.perf_counter()
        report = run_session(program, block, cfg, log=log)
        elapsed = time.perf_counter() - start
        if args.format == "json":
            print_json({"block": block.name, "losses": list(report.losses), "rows": report.rows,
                        "stand_ins": externs, "seconds": round(elapsed, 3),
                        "sites": [{"site": s.site, "rho": list(s.rho), "cos": list(s.cos)} for s in report.sites]})
        else:
            print(f"{'site':<28}{'rho p50':>9}{'rho p90':>9}{'rho p99':>9}{'cos p50':>9}{'cos p90':>9}{'cos p99':>9}")
            for s in report.sites:
                print(f"{s.site:<28}{_fmt(s.rho)}{_fmt(s.cos)}")
            print(f"\n{len(report.sites)} residual sites; rho = RMS(update)/RMS(state), cos = cosine(state, update), "
                  f"quantiles over {report.rows} rows; {elapsed:.2f} s")
        if args.plot:
            from blockir.backends.plot import plot_sites
            plot_sites(report.sites, args.plot, title=f"{program.filename}: {block.name}")
            log(f"wrote {args.plot}")
        return EXIT_OK
    return with_program(args, job)


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="build with built-in branches, train a few steps on random data, print telemetry")
    r.add_argument("file", metavar="FILE")
    add_block_option(r)
    add_dims_option(r, "B=2,S=16,D=64 (dims without a size default to B=2, S=16, others 8)")
    r.add_argument("--steps", type=int, default=1, help="training steps (forward, backward, AdamW update)")
    r.add_argument("--seed", type=int, default=0, help="seed for initialisation, data and dropout")
    r.add_argument("--lr", type=float, default=1e-3)
    r.add_argument("--plot", metavar="FILE.png", help="draw rho and cos against depth (needs matplotlib)")
    add_format_option(r, "table")
    r.set_defaults(func=run)
