"""The files of blockir's artifact directories, and the one way a name read from an artifact becomes a path.

A name found in a manifest or a run record (``release.yaml``'s ``files``, ``run.json``'s
``sha256``) is trusted only when it is one of the names blockir writes, a plain name (no
separator, no ``..``, not absolute), and names a regular file inside the folder (not a symlink,
which could point anywhere). That is checked before any file is opened.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from blockir.diagnostics import BlockError, Span, error

STATE_FILES = ("program.block", "model.pt", "optimizer.pt", "counters.pt")
RUN = "run.json"
CONVERSION = "conversion.yaml"
CALIBRATION = "calibration.json"  # written by blockir calibrate --save: its data's hash and its fold error
MANIFEST = "release.yaml"
RECORDS = (CONVERSION, CALIBRATION)  # the reports a checkpoint may hold beside its state
CHECKPOINT_NAMES = (*STATE_FILES, RUN, *RECORDS)  # what a checkpoint directory may hold
RELEASE_NAMES = (*CHECKPOINT_NAMES, MANIFEST)
MAX_FILE_BYTES = 4 << 30  # no artifact file of a model this tool can train is larger
MAX_RECORD_BYTES = 1 << 20  # run.json, release.yaml, conversion.yaml, calibration.json: text records


def where(path: str | Path, field: str | None = None) -> Span:
    """``FILE`` or ``FILE: field.path``, the location of something read from an artifact."""
    return Span(f"{path}: {field}" if field else str(path), 0, 0)


def name_error(message: str, span: Span, hint: str | None = None) -> BlockError:
    return BlockError([error("E0733", message, span, hint=hint)])


def plain_name(name: object, allowed: tuple[str, ...], span: Span) -> str:
    """``name`` if it is one of ``allowed`` and a plain name confined to its folder; else a located error."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or "\0" in name or os.path.isabs(name):
        raise name_error(f"{name!r} is not a plain file name inside the artifact's folder", span,
                         "an artifact names its own files only; this one was edited by hand")
    if name not in allowed:
        raise name_error(f"'{name}' is not a file blockir writes in this folder (files: {', '.join(allowed)})", span)
    return name


def file_in(folder: str | Path, name: str, span: Span, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``folder/name`` (a plain name already checked), read up to ``limit``."""
    path = Path(folder) / name
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            raise name_error(f"{name} in {folder} is {kind}; an artifact's files are regular files inside it", span,
                             "copy the artifact with its files, not links to them")
        if info.st_size > limit:
            raise name_error(f"{name} in {folder} holds {info.st_size:,} bytes, more than the {limit:,} an artifact "
                             "file may", span)
        with open(path, "rb") as f:
            return f.read(limit + 1)
    except OSError as exc:
        raise name_error(f"{name} in {folder} is unreadable: {exc.strerror or exc}", span) from None
