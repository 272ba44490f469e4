"""The built LALR parser, stored on disk so that a process loads it instead of rebuilding it.

Building the parser tables from ``block.lark`` costs more than the rest of a ``check``;
loading them back is a few milliseconds. The file name is a digest of everything the tables
depend on (grammar text, options, lark and Python versions), so an edited grammar or an
upgraded lark never reads stale tables. Any problem with the cache (unwritable directory,
truncated or foreign file) falls back to building in memory: the cache can only save time.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import lark
from lark import Lark

ENV = "BLOCKIR_CACHE_DIR"


def cache_dir() -> Path | None:
    """``$BLOCKIR_CACHE_DIR`` (empty: no cache), else ``$XDG_CACHE_HOME/blockir``, else ``~/.cache/blockir``."""
    if ENV in os.environ:
        return Path(os.environ[ENV]) if os.environ[ENV] else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "blockir"


def _digest(grammar: str, options: dict[str, Any]) -> str:
    key = repr((grammar, sorted(options.items()), lark.__version__, sys.version_info[:2]))
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def cached_lark(grammar: str, transformer: Any = None, **options: Any) -> Lark:
    """``Lark(grammar, transformer=transformer, **options)`` (LALR only), loaded from the cache when it
    holds these tables. The transformer is code, not tables: it is attached when loading, never stored."""
    folder = cache_dir()
    if folder is None:
        return Lark(grammar, transformer=transformer, **options)
    path = folder / f"parser-{_digest(grammar, options)}.pickle"
    try:
        with path.open("rb") as f:
            return Lark.__new__(Lark)._load(f, transformer=transformer)
    except Exception:  # missing, unreadable or corrupt: rebuild below
        pass
    parser = Lark(grammar, transformer=transformer, **options)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # write aside and rename, so a concurrent reader sees the old file or the whole new one
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".parser-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                parser.save(f, exclude_options=("transformer",))
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass
    return parser
