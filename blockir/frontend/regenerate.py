"""Rewrite the shipped parser tables from the package's grammar: ``python -m blockir.frontend.regenerate``.

Run it after editing ``block.lark``; the test suite fails while the shipped file differs from a
fresh build, and until then the parser builds its tables from the grammar on every start.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from blockir.frontend.tables import TABLES_FILE, grammar_text, render


def write(path: Path) -> None:
    """Write the tables to ``path`` through a temporary sibling renamed into place."""
    text = render(grammar_text())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # a package data file, readable by every user of the install
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    write(Path(__file__).with_name(TABLES_FILE))
