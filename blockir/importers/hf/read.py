"""Reading a transformers config from disk: a ``config.json``, or a model folder holding one.

The file is read with a size limit, decoded as UTF-8 and parsed as JSON; each failure is a located
``BlockError`` (E0805: the file cannot be read, E0806: it is not a JSON object), never a traceback.
"""
from __future__ import annotations

import json
from os import PathLike
from pathlib import Path
from typing import Any

from blockir.diagnostics import BlockError, Span, error, json_span

MAX_CONFIG_BYTES = 4 << 20  # real configs are a few KiB; a tokenizer or weights file given by mistake is refused
CONFIG_NAME = "config.json"


def config_path(path: str | PathLike[str]) -> Path:
    """The config file of ``path``: the file itself, or the ``config.json`` of a model folder."""
    p = Path(path)
    return p / CONFIG_NAME if p.is_dir() else p


def read_config(path: str | PathLike[str]) -> tuple[dict[str, Any], str]:
    """The config object at ``path`` (a file, or a folder with ``config.json``) and the name to locate it by."""
    file = config_path(path)
    name = str(file)
    at = Span(name, 0, 0)  # the file as a whole
    try:
        with file.open("rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        what = "the folder holds no config.json" if file.name == CONFIG_NAME and Path(path).is_dir() \
            and not file.exists() else f"cannot read the config: {exc.strerror or exc}"
        raise BlockError([error("E0805", what, at, hint="give a transformers config.json, or a model folder "
                                "that holds one")]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise BlockError([error("E0805", f"the config is larger than {MAX_CONFIG_BYTES >> 20} MiB", at,
                                hint="a config.json is a few KiB of JSON; is this another file of the model?")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise BlockError([error("E0806", f"the config is not UTF-8 text (byte 0x{data[exc.start]:02x})",
                                Span(name, line, column))]) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BlockError([error("E0806", f"the config is not JSON: {exc.msg}", Span(name, exc.lineno, exc.colno))],
                         {name: text}) from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits; brackets nested past the stack
        reason = "brackets nest too deep" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise BlockError([error("E0806", f"the config is not JSON blockir can read: {reason}", at)]) from None
    if not isinstance(value, dict):
        raise BlockError([error("E0806", f"a config is a JSON object, got {type(value).__name__}",
                                json_span(name), hint="transformers writes config.json as one object of fields")])
    return value, name
