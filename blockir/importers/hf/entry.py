"""The import of one config: check its fields, write the class ``architectures`` names.

The text returned is not yet checked: ``blockir.api.hf_block_text`` runs the verifiers on it before it is
handed out (a file that fails its own check is E0814), since the importer itself reads only the language.
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from blockir.diagnostics import BlockError, error, json_span
from blockir.frontend.parser import MAX_BYTES
from blockir.importers.hf.config import read_fields, role
from blockir.importers.hf.family import BASES
from blockir.importers.hf.more import MASKED
from blockir.importers.hf.schema import FAMILIES
from blockir.importers.hf.text import SOURCE, Config
from blockir.importers.hf.writer import NORMS, WRITERS


def import_text(config: Any, exact: bool = False, *, source: str = SOURCE) -> str:
    """The `.block` text for a transformers config (a dict, a JSON config's contents, or a config object), of the
    class its ``architectures`` names; every problem is a ``BlockError`` located at ``source: $.field``.

    ``exact`` writes ``impl=eager`` on every attention: HF's eager reference op for op.
    """
    raw = config.to_dict() if callable(getattr(config, "to_dict", None)) else config
    model_type, values, keys = read_fields(raw, source)
    try:
        text = WRITERS[model_type](Config(values, NORMS[model_type]), model_type, exact)
        text = _architecture(text, model_type, values.get("architectures"), source)
    except BlockError as exc:
        raise BlockError([_located(d, source) for d in exc.diagnostics]) from None
    if len(text.encode("utf-8")) > MAX_BYTES:
        layers = role(FAMILIES[model_type], "num_hidden_layers")
        where = json_span(source, (keys.get(layers, layers),))
        raise BlockError([error("E0808", f"the file for {layers}={values[layers]} would exceed the "
                                f"{MAX_BYTES >> 20} MiB a .block file may hold", where,
                                hint="this family is written one declaration per layer; use fewer layers")])
    return text


def _located(d: Any, source: str) -> Any:
    """A writer's diagnostic, named after the config's file rather than the placeholder."""
    if d.span.filename.startswith(SOURCE):
        return replace(d, span=replace(d.span, filename=source + d.span.filename[len(SOURCE):]))
    return d


def _architecture(text: str, model_type: str, architectures: list[str] | None, source: str) -> str:
    """The class the checkpoint was saved from: the written class, or the base model without the head."""
    written = re.search(r"^model (\w+)\(", text, re.M).group(1)  # type: ignore[union-attr]
    base, prefix = BASES[model_type]
    if not architectures or architectures[0] == written:
        return text
    if architectures[0] == base:
        return base_model_text(text, written, base, prefix)
    supported = [written] + ([base] if base != written else []) + \
        ([MASKED[model_type].cls] if model_type in MASKED and MASKED[model_type].cls != written else [])
    raise BlockError([error("E0812", f"architecture '{architectures[0]}' is not one blockir writes for model type "
                            f"'{model_type}'", json_span(source, ("architectures", 0)),
                            hint="supported: " + ", ".join(supported))])


def base_model_text(text: str, written: str, base: str, prefix: str) -> str:
    """The base model of a file written as ``written``: no head, keys without ``prefix``, the final hidden state."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"model {written}("))
    head = next(m.group(1) for line in lines[start:] if (m := re.match(r"  ([\w.]+): head\(", line)))
    strip = re.compile(r"(?<![\w.])" + re.escape(prefix)) if prefix else None
    out = [lines[0].replace(written, base, 1), *lines[1:start]]
    for line in lines[start:]:
        if line.startswith(f"  {head}: head("):
            continue
        if line.startswith(f"model {written}("):
            line = line.replace(f"model {written}(", f"model {base}(").replace("-> [B, S, V] {", "-> [B, S, D] {")
        elif line.startswith("  return ") and f"{head}(" in line:
            line = "  return " + _argument(line, f"{head}(")
        out.append(strip.sub("", line) if strip else line)
    return "\n".join(out)


def _argument(line: str, call: str) -> str:
    """The argument of the call ``call…)`` in ``line`` (the head's input)."""
    start = line.index(call) + len(call)
    depth = 1
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return line[start:i]
    raise ValueError(line)

