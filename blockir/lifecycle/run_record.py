"""``run.json``, the record of a checkpoint, read as a schema: every field present, of its type, nothing else.

A record is trusted field by field before any of it is used: the names in its ``sha256`` table
become paths (so each must be a file blockir writes), its ``config`` becomes a
:class:`~blockir.lifecycle.session.RunConfig` (so each setting must be one a run accepts). Every
failure is ``E0734`` at ``DIR/run.json: field.path``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from blockir.lifecycle.artifact_files import RECORDS, STATE_FILES, plain_name, where
from blockir.lifecycle.session import RunConfig, config_problems
from blockir.diagnostics import BlockError, error

FROZEN = ("seed", "lr", "warmup", "batch", "dims", "backend")
# recorded since: how the run stepped (a resumed run keeps accum and dtype, may move to another device)
SETTINGS = ("accum", "dtype", "device")
HEX = re.compile(r"[0-9a-f]{64}")
FIELDS: dict[str, str] = {"file": "text", "block": "text", "program_sha256": "sha256", "config": "table",
                          "data": "text", "data_sha256": "sha256", "step": "count", "sha256": "table"}


def record_error(path: Path, field: str | None, message: str) -> BlockError:
    return BlockError([error("E0734", message, where(path, field),
                             hint="run.json is written by blockir run --save; restore the checkpoint from its copy")])


def _kind_ok(kind: str, value: Any) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "sha256":
        return isinstance(value, str) and HEX.fullmatch(value) is not None
    if kind == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, dict)


def parse_record(text: bytes, path: Path) -> dict[str, Any]:
    """The record in ``text`` (the bytes of ``path``), after checking every field."""
    try:
        record = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise record_error(path, None, f"not a blockir checkpoint record: {str(exc)[:200]}") from None
    if not isinstance(record, dict):
        raise record_error(path, None, f"holds a JSON {type(record).__name__}, not a checkpoint record")
    missing = [k for k in FIELDS if k not in record]
    extra = sorted(str(k) for k in record if k not in FIELDS)
    if missing or extra:
        raise record_error(path, (missing or extra)[0], f"{'is missing' if missing else 'is not a field of'} "
                           f"a checkpoint record (fields: {', '.join(FIELDS)})")
    for key, kind in FIELDS.items():
        if not _kind_ok(kind, record[key]):
            raise record_error(path, key, f"is {json.dumps(record[key])[:60]}, not a {kind}")
    hashes = record["sha256"]
    for name, digest in hashes.items():
        plain_name(name, (*STATE_FILES, *RECORDS), where(path, f"sha256.{name}"))
        if not _kind_ok("sha256", digest):
            raise record_error(path, f"sha256.{name}", f"is {json.dumps(digest)[:60]}, not a sha256")
    for name in STATE_FILES:
        if name not in hashes:
            raise record_error(path, "sha256", f"records no sha256 for {name}")
    config = record["config"]
    if sorted(config) not in (sorted(FROZEN), sorted(FROZEN + SETTINGS)):  # records before SETTINGS hold FROZEN
        raise record_error(path, "config", f"holds {', '.join(map(str, config))}; a checkpoint's configuration is "
                           f"{', '.join(FROZEN + SETTINGS)}")
    for field, problem in config_problems(RunConfig(**config)):
        raise record_error(path, f"config.{field}", problem)
    if config.get("device") is not None and not isinstance(config["device"], str):
        raise record_error(path, "config.device", f"is {json.dumps(config['device'])[:60]}, not a device name or null")
    return record
