"""`blockir import hf CONFIG.json|FOLDER [-o FILE.block] [--exact] [--force]`: the `.block` of a transformers config."""
from __future__ import annotations

import argparse
import os
import tempfile
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


def write_atomic(path: Path, text: str) -> None:
    """Write aside and rename into place: a reader sees the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run(args: argparse.Namespace) -> int:
    from blockir.importers.hf import block_text
    from blockir.importers.hf_read import read_config
    destination = _destination(args.output, args.force) if args.output else None
    config, name = read_config(args.config)
    text = block_text(config, exact=args.exact, source=name)
    if destination is None:
        print(text, end="")
        return EXIT_OK
    try:
        write_atomic(destination, text)
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
