"""`blockir recipe NAME FILE [--block BLOCK] [options]`: apply a depth/normalization recipe, print the new program.

Without ``--block`` the recipe rewrites the layer the file stacks (``layers: Layer * 12``); a file that
stacks several different layers names them all in a located error (E0713). The program goes to stdout (redirect it to a .block file); the report (constants, changes, what the
paper's contract needs beyond the graph) goes to stderr; with ``--format json`` both are one JSON
object on stdout. Admin (``--data PATH --tokens N``) also profiles: it compiles the byte-level language model
``blockir run`` trains around the model that stacks the layer, runs the data file's first bytes through it
once, and records the data's sha256, the token budget and the omegas in a comment heading the program, in
the report, and in ``--manifest FILE``.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from blockir.cli import (EXIT_OK, UsageError, add_dims_option, add_force_option, add_format_option, load_program, log, print_json,
                         target_block)
from blockir.diagnostics import BlockError, Note, error
from blockir.ir.decls import InstanceDecl
from blockir.ir.program import Block, Program

PAPER_TOKENS = 8192  # Admin's profiles read no more (Liu et al., 2020)
CLI_RECIPES = ("deepnorm", "rezero", "layerscale", "tfixup", "fixup", "deepscalelm", "dyt_llm", "admin")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    if args.recipe == "deepnorm":
        return {"arch": args.arch, "decoder_layers": args.decoder_layers}
    if args.recipe == "rezero":
        return {"remove_norms": not args.keep_norms}
    if args.recipe == "layerscale":
        return {"eps": args.eps, "depth": args.depth}
    if args.recipe in ("fixup", "deepscalelm"):
        return {"depth": args.depth}
    if args.recipe == "dyt_llm":
        return {"width": args.width}
    if args.recipe == "admin":
        return {}
    return {"side": args.side}


def _text(v: Any) -> str:
    """A contract field on one line: mappings as key=value, lists comma-separated."""
    if isinstance(v, dict):
        return "; ".join(f"{k}={_text(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_text(x) for x in v) or "none"
    return str(v)


def _admin(args: argparse.Namespace, program: Program, block: Block) -> tuple[Any, Any]:
    if args.data is None or args.tokens is None:
        raise UsageError("admin profiles on data: give --data PATH and --tokens N (the paper uses at most 8192)")
    if args.tokens < 1:
        raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
    from blockir.commands.run import row_dims
    from blockir.lifecycle import checkpoint, destination
    from blockir.lifecycle.admin_data import profile_on_data

    def check_save() -> None:
        destination.check(args.save, "--save", destination.CHECKPOINT, args.force,
                          [("FILE", args.file), ("--data", args.data), ("--manifest", args.manifest)])
    if args.manifest:
        _check_destination(args.manifest, args)
    if args.save:  # before the profile, and again before writing
        check_save()
    result, profile, trainer = profile_on_data(program, block.name, args.data, args.tokens,
                                               dims=row_dims(program, args.dims), seed=args.seed)
    if args.save:
        check_save()
        saved = checkpoint.save(trainer, args.save, args.file)
        # the post-reinitialisation checkpoint, named by its hash beside the data that set it
        profile = replace(profile, checkpoint={"directory": args.save, "model_sha256": saved["sha256"]["model.pt"]})
        log(f"saved the profiled initialisation (step 0) to {args.save}")
    return result, profile


def _heading(record: dict[str, Any]) -> str:
    """The profile's identity as comments above the program: the file names the data its init came from."""
    return (f"# Admin profile: {record['tokens']} tokens ({record['batch']} windows of {record['window']} bytes) of "
            f"{record['data']}, sha256 {record['sha256']}\n"
            f"# token budget {record['budget']}; {record['model']} compiled from seed {record['seed']}; "
            f"omega_i = sqrt(Var(x_0) + sum_(j<i) Var(F_j)) per layer (see the report or the manifest)\n")


def _profile_lines(record: dict[str, Any]) -> list[str]:
    lines = [f"  profile: {record['tokens']} of a budget of {record['budget']} tokens from {record['data']} "
             f"(sha256 {record['sha256']}, {record['data_tokens']} tokens), seed {record['seed']}",
             f"  Var(x_0) = {record['profile']['input_variance']:.6g}"]
    if record["tokens"] > PAPER_TOKENS:
        lines.append(f"  note: the profile read {record['tokens']} tokens; the paper profiles on no more than "
                     f"{PAPER_TOKENS}")
    return lines + [f"  {path} = {w:.6g}" for path, w in record["omega"].items()]


def _check_destination(path: str, args: argparse.Namespace) -> None:
    from pathlib import Path
    dest = Path(path)
    if dest.exists() or dest.is_symlink():
        raise UsageError(f"--manifest {path} exists; it is never overwritten (give a new file)")
    if not dest.parent.is_dir():
        raise UsageError(f"--manifest {path}: no directory {dest.parent} to write it in")
    for option, given in (("FILE", args.file), ("--data", args.data)):
        if given is not None and Path(given).resolve() == dest.resolve():
            raise UsageError(f"--manifest {path} is {option}, which this command reads")


def _write_manifest(path: str, manifest: dict[str, Any]) -> None:
    import json

    from blockir.lifecycle.atomic import write_file
    try:
        write_file(path, (json.dumps(manifest, indent=2) + "\n").encode())
    except OSError as exc:
        raise UsageError(f"cannot write --manifest {path}: {exc.strerror or exc}") from None


def stacked_layer(program: Program, source: str) -> Block:
    """The block a stack instantiates, which a recipe rewrites when no ``--block`` is given; with no stack, the
    command line's default block. Several different stacked blocks are E0713, located at the second stack."""
    first: dict[str, tuple[Block, InstanceDecl]] = {}
    for owner in program.blocks:
        for d in owner.decls:
            if isinstance(d, InstanceDecl) and d.count is not None and d.block in program.block_map:
                first.setdefault(d.block, (owner, d))
    if len(first) == 1:
        return program.block(next(iter(first)))
    if not first:
        return target_block(program, None)
    names = ", ".join(first)
    notes = [Note(f"'{owner.name}' stacks '{layer}' here", d.span) for layer, (owner, d) in first.items()]
    second = list(first.values())[1][1]
    raise BlockError([error("E0713", f"{program.filename} stacks {len(first)} different layers ({names}): which one "
                            "the recipe rewrites is ambiguous", second.span, notes=notes,
                            hint=f"choose one with --block ({names})")], {program.filename: source})


def run(args: argparse.Namespace) -> int:
    def apply(program: Program, block: Block) -> int:
        from blockir.ir.printer import format_program
        from blockir.passes.recipes import RECIPES, RecipeError
        if args.recipe == "deepnorm" and args.arch is None:
            raise UsageError("deepnorm needs --arch (encoder-only, decoder-only or encoder-decoder)")
        profile = None
        try:
            if args.recipe == "admin":
                result, profile = _admin(args, program, block)
            else:
                result = RECIPES[args.recipe](program, block.name, **_options(args))
        except RecipeError as exc:
            raise UsageError(str(exc)) from None
        from blockir.analyses.manifest import contract_of
        from blockir.analyses.recipe_contract import CLI_NAMES, FIELDS
        contract = contract_of(result.program, block.name, CLI_NAMES[args.recipe])
        record = profile.record() if profile is not None else None
        text = (_heading(record) if record is not None else "") + format_program(result.program)
        if args.manifest and record is not None:
            _check_destination(args.manifest, args)  # again: something may have appeared there meanwhile
            _write_manifest(args.manifest, {"recipe": args.recipe, "file": args.file, "block": block.name,
                                            "profile": record, "contract": contract, "program": text})
        if args.format == "json":
            print_json({"recipe": args.recipe, "block": block.name, "report": str(result.report),
                        "contract": contract, "program": text, **({"profile": record} if record else {})})
        else:
            log(str(result.report))
            if record is not None:
                log("\n".join(_profile_lines(record)))
            log("  contract:\n" + "\n".join(f"    {f}: {_text(contract[f])}" for f in FIELDS))  # type: ignore[index]
            print(text, end="")
        return EXIT_OK
    program = load_program(args.file)
    if args.block is not None:
        return apply(program, target_block(program, args.block))
    with open(args.file, encoding="utf-8") as f:
        source = f.read()
    return apply(program, stacked_layer(program, source))


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("recipe", help="apply DeepNorm, ReZero, LayerScale, T-Fixup, Fixup, DeepScaleLM, DyT (LLM) or Admin to a block",
                       description="Rewrite a block by a depth/normalization recipe (DeepNet, ReZero, CaiT, T-Fixup, Fixup, "
                                   "DeepScaleLM, DyT; "
                                   "see docs/recipes.md) and print the new program; the report goes to stderr.")
    s.add_argument("recipe", choices=CLI_RECIPES)
    s.add_argument("file", metavar="FILE")
    s.add_argument("--block", metavar="NAME",
                   help="the layer to rewrite (default: the block the file stacks, 'layers: Layer * N')")
    s.add_argument("--arch", choices=("encoder-only", "decoder-only", "encoder-decoder"),
                   help="deepnorm: the row of the DeepNet table")
    s.add_argument("--decoder-layers", type=int, help="deepnorm, encoder side of an encoder-decoder: M")
    s.add_argument("--keep-norms", action="store_true", help="rezero: keep the norms (not the paper's contract)")
    s.add_argument("--eps", type=float, help="layerscale: initial gain (default: CaiT's rule for the depth)")
    s.add_argument("--depth", type=int, help="layerscale: depth for CaiT's rule; fixup: the depth L counts branches "
                   "over; deepscalelm: N (default: the stack's)")
    s.add_argument("--width", type=int, help="dyt_llm: the width whose alpha row applies (default: the block's)")
    s.add_argument("--side", choices=("encoder", "decoder"),
                   help="tfixup: which gains (default: decoder when the block has cross-attention)")
    s.add_argument("--data", metavar="PATH", help="admin: the text file the profile reads (bytes are tokens)")
    s.add_argument("--tokens", type=int, metavar="N", help="admin: the profile's token budget; the data must hold "
                   "at least N and the profile batch may read no more")
    s.add_argument("--seed", type=int, default=0, help="admin: the seed the profiled model is compiled from "
                   "(default 0, as blockir run)")
    add_dims_option(s, "B=2,S=64 (admin: the profile batch; unsized dims default as for blockir run)")
    s.add_argument("--manifest", metavar="FILE", help="admin: also write the profile record (data sha256, "
                   "budget, variances, omegas) and the program as JSON to FILE (a new file)")
    s.add_argument("--save", metavar="DIR", help="admin: write the profiled initialisation as a step-0 checkpoint "
                   "that blockir run --resume continues (its record names the data and its sha256)")
    add_force_option(s, "--save", "checkpoint")
    add_format_option(s, "block")
    s.set_defaults(func=run, writes="--save")
