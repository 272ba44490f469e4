"""`blockir recipe NAME FILE [--block BLOCK] [options]`: apply a depth/normalization recipe, print the new program.

The program goes to stdout (redirect it to a .block file); the report (constants, changes, what the
paper's contract needs beyond the graph) goes to stderr; with ``--format json`` both are one JSON
object on stdout. Admin is left to the Python API: its
initialisation profiles a compiled module on a calibration batch.
"""
from __future__ import annotations

import argparse
from typing import Any

from blockir.cli import EXIT_OK, UsageError, add_block_option, add_format_option, log, print_json, with_program
from blockir.ir.program import Block, Program

CLI_RECIPES = ("deepnorm", "rezero", "layerscale", "tfixup", "fixup", "deepscalelm", "dyt_llm")


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
    return {"side": args.side}


def _text(v: Any) -> str:
    """A contract field on one line: mappings as key=value, lists comma-separated."""
    if isinstance(v, dict):
        return "; ".join(f"{k}={_text(x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(_text(x) for x in v) or "none"
    return str(v)


def run(args: argparse.Namespace) -> int:
    def apply(program: Program, block: Block) -> int:
        from blockir.ir.printer import format_program
        from blockir.passes.recipes import RECIPES, RecipeError
        if args.recipe == "deepnorm" and args.arch is None:
            raise UsageError("deepnorm needs --arch (encoder-only, decoder-only or encoder-decoder)")
        try:
            result = RECIPES[args.recipe](program, block.name, **_options(args))
        except RecipeError as exc:
            raise UsageError(str(exc)) from None
        from blockir.analyses.manifest import contract_of
        from blockir.analyses.recipe_contract import CLI_NAMES, FIELDS
        contract = contract_of(result.program, block.name, CLI_NAMES[args.recipe])
        if args.format == "json":
            print_json({"recipe": args.recipe, "block": block.name, "report": str(result.report),
                        "contract": contract, "program": format_program(result.program)})
        else:
            log(str(result.report))
            log("  contract:\n" + "\n".join(f"    {f}: {_text(contract[f])}" for f in FIELDS))  # type: ignore[index]
            print(format_program(result.program), end="")
        return EXIT_OK
    return with_program(args, apply)


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("recipe", help="apply DeepNorm, ReZero, LayerScale, T-Fixup, Fixup, DeepScaleLM or DyT (LLM) to a block",
                       description="Rewrite a block by a depth/normalization recipe (DeepNet, ReZero, CaiT, T-Fixup, Fixup, "
                                   "DeepScaleLM, DyT; "
                                   "see docs/recipes.md) and print the new program; the report goes to stderr.")
    s.add_argument("recipe", choices=CLI_RECIPES)
    s.add_argument("file", metavar="FILE")
    add_block_option(s)
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
    add_format_option(s, "block")
    s.set_defaults(func=run)
