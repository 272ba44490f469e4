"""A transformers config → the values its family's HF code reads, checked, defaulted and fitted together.

:func:`read_fields` is the only way the writers see a config: it looks the family up by ``model_type``,
accepts the names of the config class's ``attribute_map``, checks every field against the family's
table (``hf_schema``), refuses values the file cannot state, fills in the class's defaults, folds the
RoPE keys into ``rope_parameters`` and checks that the sizes fit together. Keys the family does not
read are dropped: HF stores them and never reads them.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

from blockir.diagnostics import BlockError
from blockir.importers.hf.family import COMMON, REFUSED, UNWRITTEN, Family
from blockir.importers.hf.schema import FAMILIES, ROPE_LAYER_KEYS, Checker, show, check_kind, derive

# legacy RoPE keys -> where the config class puts them in rope_parameters
ROPE_LEGACY = {"rope_theta": "rope_theta", "rotary_emb_base": "rope_theta", "partial_rotary_factor":
               "partial_rotary_factor", "rotary_pct": "partial_rotary_factor"}
MAX_DEPTH = 32  # real configs nest four deep; deeper JSON is refused before anything walks it recursively
# derivations that read derived fields go last
ORDER = {"if": 0, "period": 2, "first": 2, "after": 2, "all": 2, "nope": 2, "odd": 2}


def table(family: Family) -> dict[str, tuple[Any, ...]]:
    """Every field the family reads: the shared ones, then its own."""
    return {**COMMON, **family.fields}


def role(family: Family, name: str) -> str:
    """The field that holds what HF calls ``name`` in this family (``hidden_size`` is GPT-2's ``n_embd``)."""
    return family.aliases.get(name, name)


def read_fields(raw: Any, source: str = "<hf config>") -> tuple[str, dict[str, Any], dict[str, str]]:
    """The model type, the resolved value of every field the family reads, and the key each given field came
    under (for locating later diagnostics); a ``BlockError`` with every problem found otherwise."""
    ch = Checker(source)
    if not isinstance(raw, Mapping):
        ch.add("E0806", (), f"a config is a JSON object, got {show(raw)}", "transformers writes config.json as one "
               "object of fields")
        ch.raise_if_any()
    deep = _too_deep(raw)
    if deep is not None:
        ch.add("E0806", deep, f"the config nests deeper than {MAX_DEPTH} levels", "a config is a flat object of "
               "fields, a few of them lists or objects")
        ch.raise_if_any()
    model_type = raw.get("model_type")
    if model_type is None:
        ch.add("E0811", (), "the config has no model_type", "transformers writes it into every config.json; "
               "supported: " + ", ".join(sorted(FAMILIES)))
    elif not isinstance(model_type, str) or model_type not in FAMILIES:
        reason = UNWRITTEN.get(model_type) if isinstance(model_type, str) else None
        ch.add("E0800", ("model_type",), f"model type {show(model_type)} is not supported" +
               (f": {reason}" if reason else ""), "supported: " + ", ".join(sorted(FAMILIES)))
    ch.raise_if_any()
    family = FAMILIES[model_type]
    fields = table(family)
    given: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for key, value in raw.items():
        name = role(family, key) if isinstance(key, str) else None
        if name not in fields:
            continue
        if name in given and not _same(given[name], value):
            ch.add("E0813", (key,), f"{key} and {keys[name]} name the same field with different values",
                   f"the config class reads {key} as {name}; give one of them")
            continue
        given[name], keys[name] = value, key
    for name, value in given.items():
        before = len(ch.found)
        check_kind(ch, (keys[name],), fields[name][0], value)
        if len(ch.found) == before and name in REFUSED and name not in family.states and value is not None \
                and not _same(value, REFUSED[name][0]):
            ch.add("E0800", (keys[name],), REFUSED[name][1], f"supported: {name}={show(REFUSED[name][0])}")
    ch.raise_if_any()
    values = _resolve(family, fields, given)
    _fit(ch, family, fields, values, keys)
    ch.raise_if_any()
    return model_type, values, keys


def _too_deep(raw: Mapping[str, Any]) -> tuple[str | int, ...] | None:
    """The path of a value nested deeper than ``MAX_DEPTH``, found without recursion."""
    todo: list[tuple[Any, tuple[str | int, ...]]] = [(raw, ())]
    while todo:
        value, path = todo.pop()
        if len(path) > MAX_DEPTH:
            return path[:MAX_DEPTH]
        if isinstance(value, Mapping):
            todo += [(v, (*path, str(k))) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            todo += [(v, (*path, i)) for i, v in enumerate(value)]
    return None


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                              and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _resolve(family: Family, fields: dict[str, tuple[Any, ...]], given: dict[str, Any]) -> dict[str, Any]:
    values = {name: copy.deepcopy(given[name] if name in given else spec[1]) for name, spec in fields.items()}
    layers = values[role(family, "num_hidden_layers")]
    notes = sorted(((spec[2], name) for name, spec in fields.items() if len(spec) > 2 and spec[2].startswith("=")),
                   key=lambda item: ORDER.get(item[0][1:].split()[0], 1))
    for note, name in notes:
        if note.startswith("=if "):  # "=if FIELD" or "=if FIELD else N": the value only where FIELD is set
            words = note.split()
            values[name] = values[name] if values[words[1]] else (int(words[3]) if len(words) == 4 else None)
        elif values[name] is None:
            values[name] = derive(note, values, layers)
    if "rope_parameters" in fields:
        values["rope_parameters"] = _rope(values)
    for legacy in (*ROPE_LEGACY, "rope_scaling", "rope_local_base_freq"):
        values.pop(legacy, None)
    return values


def _rope(values: dict[str, Any]) -> dict[str, Any]:
    """One ``rope_parameters`` dict (or one per layer type), as the config class folds the legacy keys in:
    ``rope_scaling`` wins over ``rope_parameters``, and the dict's own values over the top-level keys."""
    rope = copy.deepcopy(values.get("rope_scaling") or values.get("rope_parameters") or {})
    top = {to: values[key] for key, to in ROPE_LEGACY.items() if values.get(key) is not None}
    nested = bool(rope) and all(k in ROPE_LAYER_KEYS for k in rope)
    if not nested and "rope_local_base_freq" in values:  # Gemma 3: sliding layers take the local base
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": values["rope_local_base_freq"]},
                "full_attention": rope}
        nested = True
    for part in (rope.values() if nested else [rope]):
        part.setdefault("rope_type", part.pop("type", "default"))
        for k, v in top.items():
            part.setdefault(k, v)
    return rope


def _fit(ch: Checker, family: Family, fields: dict[str, tuple[Any, ...]], values: dict[str, Any],
         keys: dict[str, str]) -> None:
    """The sizes against each other, each diagnostic at the field that breaks the fit."""
    at = lambda name: (keys.get(name, name),)  # noqa: E731
    width_f, heads_f, layers_f = (role(family, n) for n in ("hidden_size", "num_attention_heads", "num_hidden_layers"))
    width, heads, layers = values.get(width_f), values.get(heads_f), values[layers_f]
    head_dim = values.get("head_dim")
    if width is not None and heads is not None and "head_dim" not in fields and width % heads:
        ch.add("E0809", at(heads_f), f"{heads_f}={heads} does not divide {width_f}={width}",
               "each head reads an equal share of the width: pick a divisor")
        return
    if head_dim is None and width is not None and heads is not None:
        head_dim = width // heads
    if head_dim == 0:
        ch.add("E0809", at(heads_f), f"{heads_f}={heads} heads of {width_f}={width} leave no channel per head",
               "give head_dim, or fewer heads than channels")
        return
    kv = values.get("num_key_value_heads")
    if kv is not None and heads is not None and heads % kv:
        ch.add("E0809", at("num_key_value_heads"), f"num_key_value_heads={kv} does not divide {heads_f}={heads}",
               "each key/value head serves num_attention_heads / num_key_value_heads query heads")
    _rotary(ch, values, keys, head_dim)
    for name in ("layer_types", "no_rope_layers"):
        listed = values.get(name)
        longer = name == "no_rope_layers" and isinstance(listed, list) and len(listed) > layers  # HF reads a prefix
        if isinstance(listed, list) and len(listed) != layers and not longer:
            ch.add("E0809", at(name), f"{name} has {len(listed)} entries for {layers_f}={layers}",
                   "one entry per layer")
    kinds = values.get("attention_types")
    if kinds is not None and sum(len(pattern) * n for pattern, n in kinds) != layers:
        ch.add("E0809", at("attention_types"), f"attention_types expands to {sum(len(p) * n for p, n in kinds)} "
               f"layers for {layers_f}={layers}", "the patterns times their repeats give one kind per layer")
    experts_f = next((n for n in ("num_local_experts", "num_experts") if n in fields), None)
    top_k, experts = values.get("num_experts_per_tok"), values.get(experts_f) if experts_f else None
    if isinstance(top_k, int) and isinstance(experts, int) and top_k > experts:
        ch.add("E0809", at("num_experts_per_tok"), f"num_experts_per_tok={top_k} exceeds {experts_f}={experts}",
               "each token is routed to that many distinct experts")
    pad, vocab = values.get("pad_token_id"), values.get("vocab_size")
    if len(fields.get("pad_token_id", ())) > 2 and fields["pad_token_id"][2] == "row" and pad is not None \
            and isinstance(vocab, int) and not -vocab <= pad < vocab:
        ch.add("E0809", at("pad_token_id"), f"pad_token_id={pad} is not a row of the {vocab}-token vocabulary",
               "HF builds the token table with padding_idx=pad_token_id, which must be a row")


def _rotary(ch: Checker, values: dict[str, Any], keys: dict[str, str], head_dim: int | None) -> None:
    """RoPE rotates pairs of channels: the rotated part of a head is even and fits in it."""
    if head_dim is None:
        return
    if ("rope_parameters" in values or "rotary_dim" in values) and head_dim % 2:
        where = next((k for k in ("head_dim", "num_attention_heads", "n_head") if k in keys), "head_dim")
        ch.add("E0809", (keys.get(where, where),), f"the head size {head_dim} is odd", "RoPE rotates pairs of "
               "channels: the language's rotary embedding needs an even head size")
        return
    rotary = values.get("rotary_dim")
    if rotary is not None and (rotary > head_dim or rotary % 2):
        ch.add("E0809", (keys.get("rotary_dim", "rotary_dim"),), f"rotary_dim={rotary} must be even and at most "
               f"the head size {head_dim}", "RoPE rotates pairs of channels of each head")
    rope = values.get("rope_parameters")
    for part in (rope.values() if rope and all(k in ROPE_LAYER_KEYS for k in rope) else [rope or {}]):
        fraction = part.get("partial_rotary_factor", 1.0)
        if int(head_dim * fraction) % 2:
            where = next((k for k in ("partial_rotary_factor", "rotary_pct", "head_dim") if k in keys),
                         "rope_parameters")
            ch.add("E0809", (keys[where] if where in keys else where,), f"RoPE would rotate {int(head_dim * fraction)} "
                   f"channels of each head ({fraction:g} of {head_dim}), an odd number",
                   "RoPE rotates pairs of channels: pick a factor that gives an even count")
        for name in ("short_factor", "long_factor"):  # LongRoPE: one factor per rotated pair
            factors, pairs = part.get(name), int(head_dim * fraction) // 2
            if isinstance(factors, list) and len(factors) != pairs and part is rope:  # per layer type: refused later
                field = keys.get("rope_scaling") or keys.get("rope_parameters", "rope_parameters")
                ch.add("E0809", (field, name), f"{name} has {len(factors)} factors for the {pairs} rotated pairs "
                       f"of each head", "LongRoPE divides each rotated pair's frequency by its own factor")
