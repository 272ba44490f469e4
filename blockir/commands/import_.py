"""`blockir import hf CONFIG.json|FOLDER [-o FILE.block] [--exact] [--force]`: the `.block` of a transformers config."""
from __future__ import annotations

import argparse
from pathlib import Path

from blockir.cli import EXIT_OK
from blockir.diagnostics import BlockError, Span, error


def _destination(output: str, force: bool) -> Path:
    """Checked before any work: an existing file is replaced only with --force, a folder never."""
    path = Path(output)
    if path.is_dir():
        raise BlockError([error("E0815", f"{output} is a folder", Span(output, 0, 0),
                                hint="name the .block file to write")])
    if path.exists() and not force:
        raise BlockError([error("E0815", f"{output} exists", Span(output, 0, 0),
                                hint="pass --force to replace it, or name another file")])
    return path


def run(args: argparse.Namespace) -> int:
    from blockir.lifecycle.atomic import write_file
    from blockir.api import hf_block_text
    from blockir.importers.hf.read import read_config
    destination = _destination(args.output, args.force) if args.output else None
    config, name = read_config(args.config)
    text = hf_block_text(config, exact=args.exact, source=name)
    if destination is None:
        print(text, end="")
        return EXIT_OK
    try:
        write_file(destination, text.encode())
    except OSError as exc:
        raise BlockError([error("E0815", f"cannot write {args.output}: {exc.strerror or exc}",
                                Span(args.output, 0, 0))]) from None
    return EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("import", help="write the .block of a model described elsewhere (hf: a transformers config)")
    s.add_argument("source", choices=("hf",))
    s.add_argument("config", metavar="CONFIG.json|FOLDER", help="a config.json, or a model folder that holds one")
    s.add_argument("-o", "--output", metavar="FILE.block", help="write here instead of stdout (atomically)")
    s.add_argument("--force", action="store_true", help="replace FILE.block if it exists")
    s.add_argument("--exact", action="store_true", help="attention as HF's eager reference, op for op (bit-exact)")
    s.set_defaults(func=run)
