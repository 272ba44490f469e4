"""A transformers config checked against its family's table before anything is written.

Every field the family's HF code reads is checked for its type and range (``KINDS``), missing fields
take the config class's defaults (derived ones as its ``__post_init__`` derives them), RoPE parameters
are folded into one ``rope_parameters`` dict as the class folds them, and the sizes are checked
against each other. Fields the family does not read are dropped, as HF never reads them. Each error
names the field by its JSON path (``config.json: $.rope_parameters.factor``).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from blockir.ir.types import MAX_DIM
from blockir.diagnostics import BlockError, Diagnostic, error, json_span
from blockir.frontend.builder import MAX_LAYERS
from blockir.ir.consts import MAX_MAGNITUDE
from blockir.importers.hf.family import ACTS, Family
from blockir.importers.hf.fields_encoders import FAMILIES as _ENCODERS
from blockir.importers.hf.fields_gpt import FAMILIES as _GPT
from blockir.importers.hf.fields_kin import FAMILIES as _KIN
from blockir.importers.hf.fields_llama import FAMILIES as _LLAMA
from blockir.importers.hf.fields_moe import FAMILIES as _MOE

FAMILIES: dict[str, Family] = {**_LLAMA, **_KIN, **_MOE, **_GPT, **_ENCODERS}
INF = MAX_MAGNITUDE  # the largest magnitude a constant of the language may have
# kind -> (what it is, low, high, low included, high included); ints are never booleans
NUMBERS: dict[str, tuple[str, float, float, bool, bool]] = {
    "size": ("a positive integer", 1, MAX_DIM, True, True),
    "heads": ("a positive integer", 1, MAX_DIM, True, True),
    "window": ("a positive integer", 1, MAX_DIM, True, True),
    "count": ("a non-negative integer", 0, MAX_DIM, True, True),
    "layers": (f"an integer from 1 to {MAX_LAYERS}", 1, MAX_LAYERS, True, True),
    "token": ("an integer", -MAX_DIM, MAX_DIM, True, True),
    "eps": ("a positive number up to 1e300", 0, INF, False, True),
    "positive": ("a positive number up to 1e300", 0, INF, False, True),
    "real": ("a number of magnitude up to 1e300", -INF, INF, True, True),
    "prob": ("a probability in [0, 1)", 0, 1, True, False),
    "fraction": ("a fraction in (0, 1]", 0, 1, False, True),
}
INTEGERS = ("size", "heads", "window", "count", "layers", "token")
LAYER_TYPES = ("full_attention", "sliding_attention")
# rope_type -> the keys its dict may hold besides rope_type/type, rope_theta and partial_rotary_factor, and the
# ones it must hold; the kind of every key
ROPE_TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()), "linear": (("factor",), ("factor",)),
    "llama3": (("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
               ("factor", "low_freq_factor", "high_freq_factor")),
    "yarn": (("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
              "mscale_all_dim", "truncate"), ()),
    "dynamic": (("factor",), ("factor",)),
    "longrope": (("factor", "original_max_position_embeddings", "short_factor", "long_factor", "attention_factor"),
                 ("short_factor", "long_factor")),
}
ROPE_KINDS = {"rope_theta": "positive", "partial_rotary_factor": "fraction", "factor": "positive",
              "original_max_position_embeddings": "size", "low_freq_factor": "positive", "high_freq_factor": "positive",
              "beta_fast": "positive", "beta_slow": "positive", "attention_factor": "positive", "mscale": "real",
              "mscale_all_dim": "real", "truncate": "bool", "short_factor": "positives", "long_factor": "positives"}
ROPE_LAYER_KEYS = LAYER_TYPES  # a dict of RoPE parameters per layer type (Gemma 3)

Path = tuple[str | int, ...]


class Checker:
    """Collects the diagnostics of one config, each at the JSON path of the value it is about."""

    def __init__(self, source: str) -> None:
        self.source, self.found = source, []  # type: list[Diagnostic]

    def add(self, code: str, path: Path, message: str, hint: str | None = None) -> None:
        self.found.append(error(code, message, json_span(self.source, path), hint=hint))

    def raise_if_any(self) -> None:
        if self.found:
            raise BlockError(self.found)


def show(value: Any) -> str:
    """A value in a message: scalars as JSON writes them, containers by their type only (they may be huge)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        text = repr(value) if not math.isinf(value) and not math.isnan(value) else str(value)
        return text if len(text) <= 40 else text[:20] + "…"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "…")
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


def _number(ch: Checker, path: Path, kind: str, value: Any) -> None:
    what, low, high, low_in, high_in = NUMBERS[kind]
    integer = kind in INTEGERS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        ch.add("E0807", path, f"{_field(path)} must be {what}, got {show(value)}",
               "write the number without quotes" if isinstance(value, str) else None)
        return
    inside = (low < value or (low_in and value == low)) and (value < high or (high_in and value == high))
    if isinstance(value, float) and not math.isfinite(value) or not inside:
        ch.add("E0808", path, f"{_field(path)} must be {what}, got {show(value)}",
               "the model would compute NaN or fail to build" if kind in ("eps", "positive", "fraction", "prob")
               else "the language bounds sizes and layer counts as it does in a .block file")


def _field(path: Path) -> str:
    return ".".join(str(p) for p in path if isinstance(p, str)) or "the config"


def _layer_types(ch: Checker, path: Path, value: Any) -> None:
    if not isinstance(value, list):
        ch.add("E0807", path, f"{_field(path)} must be a list of layer types, got {show(value)}")
        return
    for i, t in enumerate(value):
        if t not in LAYER_TYPES:
            ch.add("E0808", (*path, i), f"layer type {show(t)} is not one of {', '.join(LAYER_TYPES)}")
            return


def _list_of(ch: Checker, path: Path, value: Any, kind: str, what: str) -> None:
    if not isinstance(value, list):
        ch.add("E0807", path, f"{_field(path)} must be a list of {what}, got {show(value)}")
        return
    for i, v in enumerate(value):
        before = len(ch.found)
        check_kind(ch, (*path, i), kind, v)
        if len(ch.found) > before:
            return


def _attention_types(ch: Checker, path: Path, value: Any) -> None:
    """GPT-Neo's ``[[["global", "local"], 12]]``: patterns of attention kinds, each repeated a number of times."""
    if not isinstance(value, list):
        ch.add("E0807", path, f"attention_types must be a list of [kinds, repeats] pairs, got {show(value)}")
        return
    for i, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)):
            ch.add("E0807", (*path, i), f"each attention_types entry must be [kinds, repeats], got {show(item)}")
            return
        for j, kind in enumerate(item[0]):
            if kind not in ("global", "local"):
                ch.add("E0808", (*path, i, 0, j), f"attention kind {show(kind)} is not global or local")
                return
        _number(ch, (*path, i, 1), "layers", item[1])


def _ropes(ch: Checker, path: Path, value: Any) -> None:
    """RoPE parameters for all layers, or a dict of them per layer type (Gemma 3)."""
    if isinstance(value, dict) and value and all(k in ROPE_LAYER_KEYS for k in value):
        for k, v in value.items():
            _rope(ch, (*path, k), v)
        return
    _rope(ch, path, value)


def _rope(ch: Checker, path: Path, value: Any) -> None:
    if not isinstance(value, dict):
        ch.add("E0807", path, f"{_field(path)} must be an object of RoPE parameters, got {show(value)}")
        return
    kind = value.get("rope_type", value.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        key = "rope_type" if "rope_type" in value else "type"
        ch.add("E0800", (*path, key), f"RoPE scaling type {show(kind)} is not supported",
               "supported: " + ", ".join(ROPE_TYPES))
        return
    takes, needs = ROPE_TYPES[kind]
    for k, v in value.items():
        if k in ("rope_type", "type"):
            continue
        if k not in ROPE_KINDS or (k not in takes and k not in ("rope_theta", "partial_rotary_factor")):
            ch.add("E0810", (*path, k), f"RoPE scaling type '{kind}' has no parameter {show(k)}",
                   f"{kind} reads: " + ", ".join(("rope_theta", "partial_rotary_factor", *takes)))
            continue
        check_kind(ch, (*path, k), ROPE_KINDS[k], v)
    if kind == "yarn" and "factor" not in value and "original_max_position_embeddings" not in value:
        ch.add("E0810", path, "RoPE scaling type 'yarn' needs factor, or original_max_position_embeddings to derive it",
               "yarn reads: " + ", ".join(takes))
    for k in needs:
        if k not in value:
            ch.add("E0810", path, f"RoPE scaling type '{kind}' needs {k}", f"{kind} reads: " + ", ".join(takes))
    low, high = value.get("low_freq_factor"), value.get("high_freq_factor")
    if kind == "llama3" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)) \
            and high <= low:
        ch.add("E0810", (*path, "high_freq_factor"), f"high_freq_factor={show(high)} must exceed "
               f"low_freq_factor={show(low)}", "llama3 interpolates between the two wavelengths they bound")


STRUCTURED: dict[str, Callable[[Checker, Path, Any], None]] = {
    "layer_types": _layer_types, "rope": _rope, "ropes": _ropes, "attention_types": _attention_types,
    "flags": lambda ch, p, v: _list_of(ch, p, v, "flag", "0 or 1"),
    "tokens": lambda ch, p, v: _list_of(ch, p, v, "token", "token ids") if isinstance(v, list)
    else check_kind(ch, p, "token", v),
    "strs": lambda ch, p, v: _list_of(ch, p, v, "str", "strings"),
    "positives": lambda ch, p, v: _list_of(ch, p, v, "positive", "positive numbers"),
    "layer_list": lambda ch, p, v: _list_of(ch, p, v, "count", "layer indices"),
}


def check_kind(ch: Checker, path: Path, kind: str, value: Any) -> None:
    """``value`` is of ``kind`` (a trailing ``?`` also admits null), or a diagnostic at ``path`` says why not."""
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    if kind in NUMBERS:
        _number(ch, path, kind, value)
    elif kind in STRUCTURED:
        STRUCTURED[kind](ch, path, value)
    elif kind == "bool" and not isinstance(value, bool):
        ch.add("E0807", path, f"{_field(path)} must be true or false, got {show(value)}")
    elif kind == "flag" and (isinstance(value, bool) or value not in (0, 1)):
        ch.add("E0807", path, f"{_field(path)} entries must be 0 or 1, got {show(value)}")
    elif kind == "str" and not isinstance(value, str):
        ch.add("E0807", path, f"{_field(path)} must be a string, got {show(value)}")
    elif kind == "act":
        if not isinstance(value, str):
            ch.add("E0807", path, f"{_field(path)} must be an activation name, got {show(value)}")
        elif value not in ACTS:
            ch.add("E0800", path, f"activation {show(value)} is not supported", "supported: " + ", ".join(sorted(ACTS)))


def derive(note: str, values: Mapping[str, Any], layers: int) -> Any:
    """A default the config class derives from other fields (the ``"=…"`` notes of the tables)."""
    words = note[1:].split()
    if words[0] == "period":  # every n-th layer full, the others sliding
        n = int(words[1]) if words[1].isdigit() else values[words[1]]
        return ["sliding_attention" if (i + 1) % n else "full_attention" for i in range(layers)]
    if words[:3] == ["first", "of", "period"]:  # the first layer of every n full, the others sliding
        return ["sliding_attention" if i % int(words[3]) else "full_attention" for i in range(layers)]
    if words[0] == "after":  # sliding from the given layer on, when there is a window
        sliding = values.get("sliding_window") is not None
        return ["sliding_attention" if sliding and i >= values[words[1]] else "full_attention" for i in range(layers)]
    if words[0] == "all":
        return ["sliding_attention" if values.get(words[1]) is not None else "full_attention"] * layers
    if words[0] == "odd":  # Qwen2-MoE: with use_sliding_window, the odd-numbered layers below the given one slide
        slide = values.get("use_sliding_window")
        return ["sliding_attention" if slide and (i + 1) % 2 and i < values[words[1]] else "full_attention"
                for i in range(layers)]
    if words[0] == "every":  # 1 on every layer but each n-th
        return [int((i + 1) % values[words[1]] != 0) for i in range(layers)]
    if words[0] == "nope":  # SmolLM3: sliding where a layer has no RoPE and a window is used
        window = values.get("use_sliding_window") and values.get("sliding_window") is not None
        return ["sliding_attention" if window and not values[words[1]][i] else "full_attention" for i in range(layers)]
    if len(words) == 3:
        a, op, b = values[words[0]], words[1], _operand(words[2], values)
        return a // b if op == "//" else a ** b if op == "**" else a * b
    return values[words[0]]


def _operand(word: str, values: Mapping[str, Any]) -> Any:
    """A number written in the note, or the value of the field it names."""
    try:
        return int(word) if word.isdigit() else float(word)
    except ValueError:
        return values[word]


KIND_NAMES = (*NUMBERS, *STRUCTURED, "bool", "flag", "str", "act", "any")
