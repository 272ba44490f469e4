"""`blockir compare A.block B.block`: train two topologies from one seed on the same batches, side by side.

Both models start from the same seed and step on the very same byte windows (drawn once per
step, fed to both), each with its own dropout stream, so the only difference between the two
loss curves is the topology. The report shows both losses and the update ratio and alignment
by depth; ``--plot`` draws them.
"""
from __future__ import annotations

import argparse
import time
from itertools import zip_longest
from typing import Any

from blockir.cli import (EXIT_OK, UsageError, add_block_option, add_format_option, load_program, log, print_json,
                         target_block)
from blockir.commands.run import add_training_options, check_options, name_stand_ins, row_dims, set_threads, sites_json


def _cell(site: Any) -> str:
    if site is None:
        return f"{'':<24}{'':>9}{'':>9}"
    return f"{site.site:<24}{site.rho[0]:>9.4f}{site.cos[0]:>9.4f}"


def compare(args: argparse.Namespace) -> int:
    from blockir.lifecycle.corpus import check_buffer, load_corpus
    from blockir.lifecycle.session import RunConfig, Trainer, train
    set_threads(args.threads)
    programs = [load_program(args.a), load_program(args.b)]
    blocks = [target_block(programs[0], args.block),
              target_block(programs[1], args.block_b or (args.block if args.block in programs[1].block_map else None))]
    corpus = load_corpus(args.data, "compare")
    trainers = []
    for program, block in zip(programs, blocks):
        name_stand_ins(program, block)
        cfg = RunConfig(steps=args.steps, seed=args.seed, lr=args.lr, warmup=args.warmup, batch=args.batch,
                        dims=row_dims(program, args.dims), data=args.data, eval_every=args.eval_every,
                        backend=args.backend)
        check_options(cfg)
        trainers.append(Trainer(program, block, cfg, corpus))
    a, b = trainers
    if (a.shape.lengths, a.batch) != (b.shape.lengths, b.batch):
        raise UsageError(f"the two runs read different windows ({a.batch} x {a.shape.lengths} and {b.batch} x "
                         f"{b.shape.lengths} bytes); give both the same sizes with --dims and --batch")
    labels = [f"A {blocks[0].name}", f"B {blocks[1].name}"]
    log(f"compare {args.a}:{blocks[0].name} ({a.parameters:,} parameters) with {args.b}:{blocks[1].name} "
        f"({b.parameters:,} parameters): {args.steps} steps of {a.batch} x {a.shape.window - 1} bytes on {corpus.source}")
    # one batch a step for both: B's sampler would draw the same windows, but sharing makes it a fact
    check_buffer(args.steps * a.batch, a.shape.window, "compare", "steps")
    batches = [a.next_batch() for _ in range(args.steps)]
    start = time.perf_counter()
    reports = []
    for label, t in zip(labels, trainers):
        queue = iter(batches)
        t.next_batch = lambda q=queue: next(q)  # type: ignore[method-assign]
        reports.append(train(t, args.steps, lambda m, tag=label: log(f"{tag}: {m}")))
    elapsed = time.perf_counter() - start
    ra, rb = reports
    if args.format == "json":
        print_json({"steps": args.steps, "data": corpus.source, "seconds": round(elapsed, 3),
                    "runs": [{"file": f, "block": blk.name, "losses": list(r.losses),
                              "val_loss": r.snapshots[-1].val_loss, "sites": sites_json(r.sites)}
                             for f, blk, r in zip((args.a, args.b), blocks, reports)]})
    else:
        for label, r in zip(labels, reports):
            print(f"{label:<24} train loss {r.losses[0]:.4f} -> {r.losses[-1]:.4f}, validation {r.snapshots[-1].val_loss:.4f}"
                  if r.losses else f"{label:<24} validation {r.snapshots[-1].val_loss:.4f}")
        print()
        print(f"{'depth':<6}{'A site':<24}{'rho p50':>9}{'cos p50':>9}  {'B site':<24}{'rho p50':>9}{'cos p50':>9}")
        for i, (sa, sb) in enumerate(zip_longest(ra.sites, rb.sites)):
            print(f"{i:<6}{_cell(sa)}  {_cell(sb)}")
        print(f"\nsame seed, same {args.steps} batches; telemetry on {ra.rows} validation rows; {elapsed:.2f} s")
    if args.plot:
        from blockir.lifecycle.plot import plot_run
        plot_run(dict(zip(labels, reports)), args.plot, title=f"{args.a} vs {args.b}")
        log(f"wrote {args.plot}")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("compare", help="train two blocks from one seed on the same batches; loss and rho/cos by "
                                       "depth side by side")
    r.add_argument("a", metavar="A.block")
    r.add_argument("b", metavar="B.block")
    add_block_option(r)
    r.add_argument("--block-b", metavar="NAME", help="the block of B (default: --block's name if B has it, else "
                                                    "B's default)")
    add_training_options(r)
    r.add_argument("--plot", metavar="FILE.png", help="draw both losses and rho/cos by depth (needs matplotlib)")
    add_format_option(r, "table")
    r.set_defaults(func=compare)
