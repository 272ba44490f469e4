"""Real text for training runs: bytes from files, a train/validation split, and deterministic batches.

The default corpus is the Python standard library's own source (the ``.py`` files at the top of
``sysconfig.get_paths()["stdlib"]``): real text present on every machine that runs blockir, so a
run needs no download. Files are read as bytes in sorted order; the split is by position, the last
``VAL_FRACTION`` of the bytes being validation, so the two never overlap.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from blockir.diagnostics import BlockError, argument_error

VAL_FRACTION = 0.1
MAX_BYTES = 16 << 20  # a directory larger than this is read up to here: a run samples windows, it never needs all
SEPARATOR = b"\n\n"
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".block", ".json", ".yaml", ".yml", ".toml", ".c", ".h", ".html")


@dataclass(frozen=True)
class Corpus:
    source: str  # what was read, as a person would name it
    files: int
    train: torch.Tensor  # uint8
    val: torch.Tensor
    digest: str  # sha256 of the bytes read, so a report or checkpoint names its data exactly


def default_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def load_corpus(data: str | None, command: str = "run") -> Corpus:
    """The corpus at ``data`` (a file, or a directory of text files), else the standard library's source."""
    if data is None:
        files, source = default_files(), f"Python standard library ({sysconfig.get_paths()['stdlib']})"
    else:
        path = Path(data)
        if not path.exists():
            raise BlockError([argument_error(command, "data", f"no such file or directory: {data}")])
        files, source = _files(path), data
    chunks, total = [], 0
    for f in files:
        try:
            raw = f.read_bytes()
        except OSError:
            continue  # an unreadable file in a directory is skipped, as grep -r does
        chunks.append(raw[:MAX_BYTES - total])
        total += len(chunks[-1])
        if total >= MAX_BYTES:
            break
    blob = SEPARATOR.join(chunks)
    if len(blob) < 64:
        raise BlockError([argument_error(command, "data", f"{source} holds {len(blob)} bytes of text; "
                                         "a run needs at least 64", "give a larger text file or directory")])
    cut = int(len(blob) * (1 - VAL_FRACTION))
    data_t = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    return Corpus(source, len(chunks), data_t[:cut].clone(), data_t[cut:].clone(), hashlib.sha256(blob).hexdigest())


def check_windows(corpus: Corpus, length: int, command: str = "run") -> None:
    """Both splits must hold a whole window: training samples inside one, validation reads fixed ones."""
    for split, data, need in (("training", corpus.train, length + 1), ("validation", corpus.val, length)):
        if data.numel() < need:
            raise BlockError([argument_error(command, "data", f"the {split} split of {corpus.source} holds "
                                             f"{data.numel()} bytes, fewer than one window of {need}",
                                             "use a shorter sequence length or more text")])


MAX_WINDOW_BYTES = 4 << 30  # token windows held at once (int64): more never fits a machine this trains on


def check_buffer(rows: int, length: int, command: str, argument: str) -> None:
    """Refuse, before allocating, ``rows`` windows of ``length`` tokens that would not fit in memory."""
    need = rows * length * 8
    if need > MAX_WINDOW_BYTES:
        raise BlockError([argument_error(command, argument, f"{rows:,} windows of {length} bytes would take "
                                         f"{need / (1 << 30):,.1f} GiB as token ids; the limit is "
                                         f"{MAX_WINDOW_BYTES >> 30} GiB", "ask for fewer windows")])


def windows(data: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """Rows ``data[s : s + length]`` for each start, as int64 token ids."""
    offsets = torch.arange(length)
    return data[starts.unsqueeze(1) + offsets].long()


def sample_starts(data: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """Random window starts drawn from ``gen`` alone, so the batch stream is saved and resumed with it."""
    if data.numel() <= length:
        raise BlockError([argument_error("run", "data", f"the split holds {data.numel()} bytes, fewer than one "
                                         f"window of {length + 1}", "use a smaller sequence length or more text")])
    return torch.randint(0, data.numel() - length, (batch,), generator=gen)


def fixed_starts(data: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """Evenly spaced windows: validation sees the same bytes at every evaluation."""
    last = data.numel() - length
    return torch.linspace(0, max(last - 1, 0), batch).long()
