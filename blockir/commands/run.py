"""`blockir run FILE`: the main job — train a byte-level language model around the block on real text.

The report (loss, validation loss, tokens/s and the per-site telemetry table, or JSON) goes to
stdout; progress goes to stderr (a progress bar on a terminal, one line a step otherwise).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

from blockir.cli import (EXIT_OK, UsageError, add_block_option, add_dims_option, add_force_option, add_format_option,
                         log, print_json, with_callees, with_program)
from blockir.analyses.facts import stated
from blockir.analyses.sizes import block_env, program_env
from blockir.api import read_source
from blockir.reports.depth_tables import drift_json, drift_table, moments_json, moments_table, profile_table
from blockir.diagnostics import BlockError, error
from blockir.ir.decls import ExternDecl
from blockir.ir.program import Block, Program

DEFAULT_ROW_DIMS = {"batch": 8, "seq": 64}
DEFAULT_STEPS = 30


def row_dims(program: Program, given: dict[str, int]) -> dict[str, int]:
    """The given sizes, with defaults for dims the file leaves open (batch 8, sequence 64, others 8)."""
    dims = dict(given)
    for d in program.dims:
        if d.size is None and d.name not in dims:
            dims[d.name] = DEFAULT_ROW_DIMS.get(d.role.value, 8)
    return dims


def name_stand_ins(program: Program, block: Block) -> list[str]:
    decls = [(f"{b.name}.{d.name}", d) for b in with_callees(program, block) for d in b.decls
             if isinstance(d, ExternDecl)]
    externs = [name for name, d in decls if d.contract is None]
    if externs:
        log(f"blockir: externs replaced by linear stand-ins (a Linear of their first input; bind real modules "
            f"with blockir.compile): {', '.join(externs)}")
    norms = [name for name, d in decls if d.contract is not None]
    if norms:
        log(f"blockir: extern norms replaced by the built-in norm their contract states: {', '.join(norms)}")
    return [name for name, _ in decls]


def progress_bar(total: int, mode: str = "auto") -> tuple[Callable[[int, float], None] | None, Callable[[], None]]:
    """A tqdm bar on stderr when it is a terminal (``auto``) or when asked (``on``); otherwise None (the session
    logs one line a step). stdout never carries it, so ``--format json`` stays one JSON document."""
    if mode == "off" or (mode == "auto" and not sys.stderr.isatty()):
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        if mode == "on":
            raise UsageError("--progress on draws its bar with tqdm, which is not installed: "
                             "pip install tqdm") from None
        return None, lambda: None
    bar = tqdm(total=total, initial=0, desc="train", unit="step", file=sys.stderr, leave=False)

    def update(step: int, loss: float) -> None:
        bar.set_postfix(step=step, loss=f"{loss:.4f}")
        bar.update(1)
    return update, bar.close


def _fmt(values: tuple[float, ...]) -> str:
    return "".join(f"{v:>9.4f}" for v in values)


def telemetry_table(sites: Any, rows: int) -> list[str]:
    lines = [f"{'site':<28}{'rho p50':>9}{'rho p90':>9}{'rho p99':>9}{'cos p50':>9}{'cos p90':>9}{'cos p99':>9}"]
    lines += [f"{s.site:<28}{_fmt(s.rho)}{_fmt(s.cos)}" for s in sites]
    lines.append(f"{len(sites)} residual sites; rho = RMS(update)/RMS(state), cos = cosine(state, update), "
                 f"quantiles over {rows} validation rows")
    return lines


def _opt(v: float | None, width: int = 12) -> str:
    return f"{v:>{width}.4g}" if v is not None else f"{'-':>{width}}"


def method_table(methods: Any) -> list[str]:
    """Gate values and DyT alpha/saturation with their last gradient norms (empty without such parameters)."""
    if not methods:
        return []
    lines = [f"{'parameter':<28}{'kind':>6}{'value':>12}{'grad norm':>12}{'saturated':>12}{'input min':>12}"
             f"{'input max':>12}{'slope p01':>12}{'slope p50':>12}"]
    lines += [f"{m.site:<28}{m.kind:>6}{m.value:>12.4g}{_opt(m.grad_norm)}{_opt(m.saturated)}"
              f"{_opt(m.input_range and m.input_range[0])}{_opt(m.input_range and m.input_range[1])}"
              f"{_opt(m.slope and m.slope[0])}{_opt(m.slope and m.slope[1])}" for m in methods]
    lines.append("value: a scalar gate, a vector gate's mean |g|, or DyT's alpha; grad norm: the last step's; "
                 "saturated: fraction of DyT inputs with |alpha x| > 2; slope: 1 - tanh^2(alpha x), its 1% and 50% "
                 "quantiles over DyT's input elements")
    return lines


def methods_json(methods: Any) -> list[dict[str, Any]]:
    return [{"parameter": m.site, "kind": m.kind, "value": m.value, "grad_norm": m.grad_norm,
             "saturated": m.saturated, "input_range": None if m.input_range is None else list(m.input_range),
             "slope": None if m.slope is None else list(m.slope)} for m in methods]


def scores_table(scores: Any) -> list[str]:
    """One line per carried score state: its RMS and the attention entropy it leads to."""
    lines = [f"{'score state':<28}{'rms':>9}{'entropy':>9}"]
    lines += [f"{s.site:<28}{s.rms:>9.4f}{s.entropy:>9.4f}" for s in scores]
    lines.append(f"{len(scores)} score states; rms of the running score sum, mean attention entropy in nats")
    return lines


def sites_json(sites: Any) -> list[dict[str, Any]]:
    return [{"site": s.site, "rho": list(s.rho), "cos": list(s.cos)} for s in sites]


def sphere_line(sphere: tuple[float, float]) -> str:
    return (f"hypersphere: hidden-row norm error max |‖h‖-1| = {sphere[0]:.2e}; parameter norm error max "
            f"|‖w‖-1| = {sphere[1]:.2e} after the projection")


def sphere_json(sphere: tuple[float, float] | None) -> dict[str, float] | None:
    return None if sphere is None else {"hidden_row_norm_error": sphere[0], "parameter_norm_error": sphere[1]}


def scales_table(scales: Any) -> list[str]:
    """nGPT's learned scales as applied: each update's eigen rate, each attention's s_qk, the logits' s_z."""
    lines = [f"{'scale':<28}{'kind':<12}{'min':>10}{'max':>10}{'mean':>10}"]
    lines += [f"{s.site:<28}{s.kind:<12}{s.low:>10.4g}{s.high:>10.4g}{s.mean:>10.4g}" for s in scales]
    lines.append("applied values (the stored vector times its constant): min, max and mean over its entries")
    return lines


def scales_json(scales: Any) -> list[dict[str, Any]]:
    return [{"site": s.site, "kind": s.kind, "parameter": s.param, "factor": s.factor, "min": s.low, "max": s.high,
             "mean": s.mean} for s in scales]


def warmup_free(program: Program, warmup: int) -> None:
    """T-Fixup trains without learning-rate warmup: a program stating it refuses a warmup schedule."""
    base = program_env(program)
    for b in program.blocks:
        fact = stated(b, block_env(base, b)).get("tfixup")
        if warmup > 0 and fact is not None and fact.value == 1:
            raise BlockError([error("E0756", f"'{b.name}' states tfixup = 1, and T-Fixup trains without learning-rate "
                                    f"warmup, but the run asks for --warmup {warmup}", fact.const.span,
                                    hint="run with --warmup 0 (the default): T-Fixup's initialisation is what "
                                         "replaces the warmup")],
                             {program.filename: read_source(program.filename)})


WHERE = {"device": "blockir run --device", "compile": "blockir run --compile-backend"}


def run(args: argparse.Namespace) -> int:
    def job(program: Program, block: Block, pretrained: Any = None) -> int:
        from blockir.lifecycle import checkpoint, destination
        from blockir.lifecycle.corpus import load_corpus
        from blockir.lifecycle.session import RunConfig, Trainer, train
        cfg = RunConfig(steps=args.steps, seed=args.seed, lr=args.lr, warmup=args.warmup, batch=args.batch,
                        dims=row_dims(program, args.dims), data=args.data, eval_every=args.eval_every,
                        backend=args.backend, accum=args.accum, device=args.device, dtype=args.dtype,
                        compile=args.compile_backend if args.compile else None)
        check_options(cfg)
        warmup_free(program, args.warmup)
        if args.plot:  # before training, not after it
            from blockir.lifecycle.plot import require_matplotlib
            require_matplotlib()
        set_threads(args.threads)
        def check_save() -> None:
            destination.check(args.save, "--save", destination.CHECKPOINT, args.force,
                              [("FILE", args.file), ("--data", args.data), ("--resume", args.resume)], same=args.resume)
        if args.save:  # before any work, and again before writing (something may have appeared there meanwhile)
            check_save()
        externs = name_stand_ins(program, block)
        if args.resume:
            cfg = checkpoint.resumed_config(args.resume, cfg)
        corpus = load_corpus(cfg.data)
        trainer = Trainer(program, block, cfg, corpus, pretrained, WHERE)
        profile = start_profile(args, program, trainer)
        if args.resume:
            checkpoint.load(trainer, args.resume)
            log(f"resumed {args.resume} at step {trainer.step_count}")
        accum = f" x {cfg.accum} micro-batches" if cfg.accum > 1 else ""
        log(f"run {block.name}: {trainer.parameters:,} parameters, batch {trainer.batch}{accum} x "
            f"{trainer.shape.window - 1} bytes, {args.steps} step{'s' if args.steps != 1 else ''} on {corpus.source} "
            f"({corpus.files} files, {corpus.train.numel():,} train / {corpus.val.numel():,} validation bytes); "
            f"{trainer.device}, {cfg.dtype}{', compiled (' + cfg.compile + ')' if cfg.compile else ''}")
        update, close = progress_bar(args.steps, args.progress)
        start = time.perf_counter()
        try:
            report = train(trainer, args.steps, log, update, after_step=profile.after_step if profile else None)
        finally:
            close()
        elapsed = time.perf_counter() - start
        if args.save:
            check_save()
            checkpoint.save(trainer, args.save, args.file)
            log(f"saved step {trainer.step_count} to {args.save}")
        final = report.snapshots[-1]
        norms = final.norms
        if args.format == "json":
            print_json({"block": block.name, "data": corpus.source, "first_step": report.first_step,
                        "losses": list(report.losses), "val_loss": final.val_loss,
                        "tokens_per_s": round(report.tokens_per_s, 1), "rows": report.rows, "stand_ins": externs,
                        "seconds": round(elapsed, 3), "sites": sites_json(final.sites),
                        "sphere": sphere_json(final.sphere), "ngpt_scales": scales_json(final.scales),
                        "methods": methods_json(final.methods),
                        "moments": moments_json(final.moments), "norm_drift": drift_json(final.drift),
                        **({"profile": profile.json()} if profile else {}),
                        "scores": [{"site": s.site, "rms": s.rms, "entropy": s.entropy} for s in final.scores],
                        "snapshots": [{"step": s.step, "val_loss": s.val_loss, "sites": sites_json(s.sites)}
                                      for s in report.snapshots],
                        "batch_norms": [{"name": n.name, "step": n.step, "transition": n.transition,
                                         "gamma": None if n.gamma is None else round(n.gamma, 6), "running_stat_age": n.age,
                                         "calibrated_at": n.calibrated_at} for n in norms]})
        else:
            if report.losses:
                print(f"train loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f} over steps "
                      f"{report.first_step + 1}-{report.first_step + len(report.losses)}; validation loss "
                      f"{final.val_loss:.4f} at step {final.step}; {report.tokens_per_s:,.0f} tokens/s; {elapsed:.2f} s")
            else:
                print(f"validation loss {final.val_loss:.4f} at step {final.step}")
            print()
            print("\n".join(telemetry_table(final.sites, report.rows)))
            if norms:
                print()
                print("\n".join(n.line() for n in norms))
            if final.sphere is not None:
                print(sphere_line(final.sphere))
            if final.scales:
                print()
                print("\n".join(scales_table(final.scales)))
            if final.methods:
                print()
                print("\n".join(method_table(final.methods)))
            if final.scores:
                print()
                print("\n".join(scores_table(final.scores)))
            for section in (moments_table(final.moments), drift_table(final.drift),
                            profile_table(profile) if profile else []):
                if section:
                    print()
                    print("\n".join(section))
        if args.plot:
            from blockir.lifecycle.plot import plot_run
            plot_run({block.name: report}, args.plot, title=f"{program.filename}: {block.name}",
                     profile=profile)
            log(f"wrote {args.plot}")
        return EXIT_OK
    if os.path.isdir(args.file):  # a transformers model folder: its causal LM with the weights it holds
        if args.block:
            raise UsageError(f"{args.file} is a model folder, which holds one model; --block chooses a block of a "
                             ".block file")
        from blockir.lifecycle.pretrained import pretrained_for_training
        lm = pretrained_for_training(args.file)
        return job(lm.program, lm.program.block(lm.name), lm.compiled)
    return with_program(args, job)


def start_profile(args: argparse.Namespace, program: Program, trainer: Any) -> Any:
    """With --profile, the depth profile of ``trainer``'s model as initialised (before a resumed state loads)."""
    if not args.profile:
        return None
    from blockir.analyses.sizes import Sizes
    from blockir.lifecycle.profile import DepthProfile
    return DepthProfile.start(program, trainer.block, trainer.model.core, Sizes.of(program, trainer.cfg.dims))


OPTIONS = {"steps": "--steps", "seed": "--seed", "lr": "--lr", "warmup": "--warmup", "batch": "--batch",
           "eval_every": "--eval-every", "dims": "--dims", "backend": "--backend", "eval_batches": "--eval-batches",
           "accum": "--accum", "dtype": "--dtype", "compile": "--compile-backend"}


def check_options(cfg: Any) -> None:
    """A usage error for the first training option a run cannot honour (the session owns the rules)."""
    from blockir.lifecycle.session import config_problems
    for field, problem in config_problems(cfg):
        raise UsageError(f"{OPTIONS.get(field, field)} {problem}")


def add_training_options(r: argparse.ArgumentParser) -> None:
    """Options shared by the commands that train (`run`, `compare`)."""
    add_dims_option(r, "B=8,S=64,D=64 (dims without a size default to batch 8, sequence 64, others 8)")
    r.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"training steps (forward, backward, AdamW update); default {DEFAULT_STEPS}")
    r.add_argument("--seed", type=int, default=0, help="seed for initialisation, batches, dropout and stochastic depth")
    r.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate after warmup (default 3e-3)")
    r.add_argument("--warmup", type=int, default=0, help="linear warmup steps (default 0)")
    r.add_argument("--batch", type=int, help="windows per step (default: the batch dim's size)")
    r.add_argument("--data", metavar="PATH", help="a text file or a directory of text files, read as bytes "
                   "(default: the Python standard library's source files)")
    r.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="validation loss and telemetry every N steps (default: at the end)")
    r.add_argument("--backend", choices=("fx", "fused"), default="fx")
    r.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU threads for torch (default 1: models this small step fastest on one thread, and "
                        "several threads stall when the machine is shared)")


def set_threads(n: int) -> None:
    import torch
    if n < 1:
        raise UsageError(f"--threads must be at least 1, got {n}")
    torch.set_num_threads(n)


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("run", help="train a byte-level language model around the block on real text; print "
                                   "loss, tokens/s and residual telemetry")
    r.add_argument("file", metavar="FILE", help="a .block file, or a transformers model folder (config.json and "
                   "weights, as save_pretrained writes them) whose causal LM is trained from its weights")
    add_block_option(r)
    add_training_options(r)
    r.add_argument("--accum", type=int, default=1, metavar="K",
                   help="gradient accumulation: K micro-batches of --batch windows per optimizer step (default 1)")
    r.add_argument("--device", default=None, help="where to train: cpu (the default), cuda, cuda:1, mps, …")
    r.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: fp32 master weights, forward and backward under bf16 autocast (default fp32)")
    r.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    r.add_argument("--compile-backend", default="inductor", metavar="NAME",
                   help="the torch.compile backend of --compile (default inductor)")
    r.add_argument("--progress", choices=("auto", "on", "off"), default="auto",
                   help="a progress bar on stderr: when stderr is a terminal (auto), always, or never")
    r.add_argument("--save", metavar="DIR", help="write a checkpoint (model, optimizer, schedule, RNG) at the end")
    r.add_argument("--resume", metavar="DIR", help="continue a saved run; its seed, sizes, rates and data are kept")
    add_force_option(r, "--save", "checkpoint")
    r.add_argument("--plot", metavar="FILE.png", help="draw loss against step and rho/cos against depth "
                   "(needs matplotlib)")
    r.add_argument("--profile", action="store_true", help="record the gradient norm of every layer and weight "
                   "group after each step, and the spread of every branch matrix at initialisation against the "
                   "spread its declaration states")
    add_format_option(r, "table")
    r.set_defaults(func=run, writes="--save")
