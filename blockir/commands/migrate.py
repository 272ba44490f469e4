"""`blockir migrate SRC.block DST.block --checkpoint DIR [--map MAP.yaml] --out DIR`: convert a run checkpoint.

The conversion report (YAML, or JSON with ``--format json``) goes to stdout and, for an accepted
conversion, into the new checkpoint as ``conversion.yaml``. Exit 0 when converted; 1 when refused
(the candidate computes another function and ``--allow-function-change`` was not given), with the
report still printed; 2 for a usage problem.
"""
from __future__ import annotations

import argparse

from blockir.cli import (EXIT_ERRORS, EXIT_OK, UsageError, add_force_option, add_format_option, emit, load_program,
                         log, print_json, target_block)

MAX_MAP_BYTES = 1 << 20  # a reviewed key map is a page of text


def migrate(args: argparse.Namespace) -> int:
    from blockir.analyses.manifest import to_yaml
    from blockir.analyses.migration import parse_key_map
    from blockir.lifecycle import destination
    from blockir.lifecycle.migrate import convert
    from blockir.commands.run import set_threads
    set_threads(1)
    if args.out:  # before any work
        destination.check(args.out, "--out", destination.CHECKPOINT, args.force,
                          [("SRC.block", args.src), ("DST.block", args.dst), ("--checkpoint", args.checkpoint),
                           ("--map", args.map)])
    src, dst = load_program(args.src), load_program(args.dst)
    a = target_block(src, args.block)
    b = target_block(dst, args.block_b or (args.block if args.block in dst.block_map else None))
    keymap = None
    if args.map:
        try:
            with open(args.map, encoding="utf-8") as f:
                text = f.read(MAX_MAP_BYTES + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the key map {args.map}: {getattr(exc, 'strerror', None) or exc}") from None
        if len(text) > MAX_MAP_BYTES:
            raise UsageError(f"the key map {args.map} is larger than {MAX_MAP_BYTES:,} characters; a reviewed map "
                             "is a page of patterns")
        keymap = parse_key_map(text, args.map)
    result = convert(src, a, dst, b, args.checkpoint, keymap, args.out, args.allow_function_change, args.src, args.dst)
    if args.format == "json":
        print_json(result.report)
    else:
        print(to_yaml(result.report, report=True), end="")
    if result.refusal is not None:
        emit(result.refusal.diagnostics, {})
        return EXIT_ERRORS
    if args.out:
        log(f"wrote {args.out} ({result.report['function']['verdict']}; zero-error claim: "
            f"{'yes' if result.report['zero_error_claim'] else 'no'})")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("migrate", help="convert a run checkpoint to another graph by a reviewed key map; "
                                       "print the conversion report")
    r.add_argument("src", metavar="SRC.block", help="the program the checkpoint was trained on")
    r.add_argument("dst", metavar="DST.block", help="the candidate program")
    r.add_argument("--checkpoint", required=True, metavar="DIR", help="a `blockir run --save` checkpoint of SRC")
    r.add_argument("--map", metavar="MAP.yaml", help="the reviewed key map: rename, transpose, reshape and drop "
                   "sections; {name} stands for one key segment (default: every key keeps its name)")
    r.add_argument("--out", metavar="DIR", help="write the converted checkpoint (with conversion.yaml) here")
    add_force_option(r, "--out", "checkpoint")
    r.add_argument("--block", metavar="NAME", help="SRC's block (default: the last model, else the only block)")
    r.add_argument("--block-b", metavar="NAME", help="DST's block (default: --block's name if DST has it)")
    r.add_argument("--allow-function-change", action="store_true",
                   help="convert even when DST computes another function (the report then claims no zero error "
                        "and asks for training evidence)")
    add_format_option(r, "yaml")
    r.set_defaults(func=migrate, writes="--out")
