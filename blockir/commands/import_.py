"""`blockir import hf CONFIG.json|FOLDER [-o FILE.block] [--exact]`: the `.block` of a transformers config."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from blockir.cli import EXIT_OK, UsageError


def run(args: argparse.Namespace) -> int:
    from blockir.importers.hf import block_text
    if Path(args.config).is_dir():  # a model folder: its config.json, refused with a location when unusable
        from blockir.backends.hf_folder import read_config
        config = read_config(Path(args.config))
    else:
        try:
            config = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read {args.config} as a JSON config: {exc}") from None
    text = block_text(config, exact=args.exact)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("import", help="write the .block of a model described elsewhere (hf: a transformers config)")
    s.add_argument("source", choices=("hf",))
    s.add_argument("config", metavar="CONFIG.json|FOLDER", help="a config.json, or the model folder holding it")
    s.add_argument("-o", "--output", metavar="FILE.block", help="write here instead of stdout")
    s.add_argument("--exact", action="store_true", help="attention as HF's eager reference, op for op (bit-exact)")
    s.set_defaults(func=run)
