"""`blockir calibrate FILE --block B [--data PATH] [--steps N] [--resume DIR] [--save DIR]`: recompute the running
moments of every batchnorm and prepbn in the byte-level language model around the block, on real text, with
everything else frozen; print each norm's transition and statistics state afterwards."""
from __future__ import annotations

import argparse
import json

from blockir.cli import (
    EXIT_OK,
    UsageError,
    add_block_option,
    add_dims_option,
    add_force_option,
    add_format_option,
    log,
    print_json,
    with_program,
)
from blockir.commands.run import check_options, row_dims, set_threads
from blockir.ir.program import Block, Program

DEFAULT_BATCHES = 20


def run(args: argparse.Namespace) -> int:
    def job(program: Program, block: Block) -> int:
        from blockir.lifecycle import checkpoint, destination
        from blockir.lifecycle.artifact_files import CALIBRATION
        from blockir.lifecycle.calibrate import calibrate, norm_states
        from blockir.lifecycle.calibration_report import calibration_record, fold_error
        from blockir.lifecycle.corpus import check_buffer, fixed_starts, load_corpus, windows
        from blockir.lifecycle.session import RunConfig, Trainer
        if args.steps < 1:
            raise UsageError(f"--steps must be at least 1, got {args.steps}")
        set_threads(args.threads)
        def check_save() -> None:
            destination.check(args.save, "--save", destination.CHECKPOINT, args.force,
                              [("FILE", args.file), ("--data", args.data), ("--resume", args.resume)], same=args.resume)
        if args.save:  # before any work, and again before writing (something may have appeared there meanwhile)
            check_save()
        cfg = RunConfig(dims=row_dims(program, args.dims), backend=args.backend)
        check_options(cfg)
        if args.resume:
            # calibration takes no optimizer step: the checkpoint's stepping carries on into the one it saves
            cfg = checkpoint.resumed_config(args.resume, cfg, carry=("accum", "dtype"))
            checkpoint.check_program(args.resume, program, block.name)
        data = load_corpus(args.data, "calibrate")
        # the calibration data may differ from the training data: the saved checkpoint names the former
        trainer = Trainer(program, block, cfg, data)
        n, width = trainer.batch, trainer.shape.window
        check_buffer(n * args.steps, width, "calibrate", "steps")
        if args.resume:
            checkpoint.restore(trainer, args.resume)
        starts = fixed_starts(data.train, n * args.steps, width)
        batches = list(windows(data.train, starts, width).split(n))
        calibrate(trainer.model, batches)
        states = norm_states(trainer.model.core)
        record = calibration_record(data.source, batches, states,
                                    fold_error(program, block, trainer.model, batches, cfg.dims))
        if args.save:
            check_save()
            checkpoint.save(trainer, args.save, args.file,
                            {CALIBRATION: (json.dumps(record, indent=2) + "\n").encode()})
            log(f"saved the calibrated step {trainer.step_count} to {args.save}")
        fold = record["fold"]
        if args.format == "json":
            print_json({"block": block.name, "data": data.source, "batches": args.steps, "batch": n,
                        "batches_sha256": record["batches_sha256"], "fold": fold,
                        "norms": [{"name": s.name, "step": s.step, "transition": s.transition, "gamma": s.gamma,
                                   "num_batches_tracked": s.tracked, "calibrated_at": s.calibrated_at}
                                  for s in states]})
        else:
            print(f"calibrated {len(states)} norm{'s' if len(states) != 1 else ''} of {block.name} on {args.steps} "
                  f"batches of {n} x {width} bytes from {data.source} (sha256 {record['batches_sha256']})")
            print("\n".join(s.line() for s in states))
            if fold["refused"] is not None:
                print(f"fold: refused: {fold['refused']}")
            else:
                print(f"fold: max |folded - unfolded| = {fold['max_error']:.3e} on the calibration batches "
                      f"(folds {', '.join(fold['folded']) or 'no norm'})")
        return EXIT_OK
    return with_program(args, job)


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="recompute the running moments of every batchnorm and prepbn on data, "
                                         "everything else frozen")
    c.add_argument("file", metavar="FILE")
    add_block_option(c)
    add_dims_option(c, "B=8,S=64,D=64 (dims without a size default to batch 8, sequence 64, others 8)")
    c.add_argument("--data", metavar="PATH", help="calibration text: a file or a directory of text files, read as "
                   "bytes (default: the Python standard library's source files)")
    c.add_argument("--steps", type=int, default=DEFAULT_BATCHES,
                   help=f"calibration batches (default {DEFAULT_BATCHES})")
    c.add_argument("--resume", metavar="DIR", help="calibrate the model of a `blockir run --save` checkpoint")
    c.add_argument("--save", metavar="DIR", help="write the calibrated checkpoint")
    add_force_option(c, "--save", "checkpoint")
    c.add_argument("--backend", choices=("fx", "fused"), default="fx")
    c.add_argument("--threads", type=int, default=1, metavar="N", help="CPU threads for torch (default 1)")
    add_format_option(c)
    c.set_defaults(func=run, writes="--save")
