"""The LALR parser tables of ``block.lark``, shipped in the package as JSON data.

Building the tables from the grammar costs more than the rest of a ``check``; loading them is a
few milliseconds. The file holds data only (nothing in it is ever executed or unpickled) and
states what it was built from: a SHA-256 of the grammar text and of the parser options, the
lark version, and a SHA-256 of its own table text. A file that does not match all of them —
an edited grammar, another lark, a truncated or foreign file — is ignored and the tables are
built from the grammar in memory, so the file can only save time, never change a parse.

Regenerate after editing the grammar (a test compares the shipped file with a fresh build):

    python -m blockir.frontend.regenerate
"""
from __future__ import annotations

import hashlib
import json
from collections import deque
from importlib import resources
from typing import Any

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

from blockir.frontend.lexer import SharedScannerLexer

FORMAT = 1
TABLES_FILE = "block.tables.json"
# Options that decide the tables; the transformer is code and is attached on load, never stored.
OPTIONS: dict[str, Any] = {"parser": "lalr", "maybe_placeholders": True}
# Code that lexes like lark's own contextual lexer, faster to start; attached on load like the transformer.
PLUGINS: dict[str, Any] = {"ContextualLexer": SharedScannerLexer}


def grammar_text() -> str:
    return resources.files("blockir.frontend").joinpath("block.lark").read_text()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _header(grammar: str, body: str) -> dict[str, Any]:
    return {"format": FORMAT, "grammar_sha256": _sha256(grammar),
            "options_sha256": _sha256(json.dumps(OPTIONS, sort_keys=True)),
            "lark": lark.__version__, "tables_sha256": _sha256(body)}


def _canonical_table(table: dict[str, Any]) -> dict[str, Any]:
    """Lark numbers states and tokens in an order that depends on string hashing, so two builds of one
    grammar differ in spelling. Renumber states breadth-first from the start states (transitions taken in
    token-name order) and tokens by name; the automaton is unchanged, only its numbering."""
    names: dict[int, str] = table["tokens"]
    states: dict[int, dict[int, tuple[int, Any]]] = table["states"]
    order: dict[int, int] = {}
    queue = deque(table["start_states"][s] for s in sorted(table["start_states"]))
    while queue:
        state = queue.popleft()
        if state in order:
            continue
        order[state] = len(order)
        for token, (action, arg) in sorted(states[state].items(), key=lambda item: names[item[0]]):
            if action == 0:  # shift (or goto): arg is the next state
                queue.append(arg)
    assert len(order) == len(states), "every LALR state is reachable from a start state"
    tokens = sorted(set(names.values()))
    token_id = {name: i for i, name in enumerate(tokens)}
    by_new = sorted(order, key=order.__getitem__)
    rows = []
    for old in by_new:
        row = sorted((token_id[names[t]], action, order[arg] if action == 0 else arg)
                     for t, (action, arg) in states[old].items())
        rows.append([list(r) for r in row])
    return {"tokens": tokens, "states": rows,
            "start_states": {k: order[v] for k, v in sorted(table["start_states"].items())},
            "end_states": {k: order[v] for k, v in sorted(table["end_states"].items())}}


def _lark_table(table: dict[str, Any]) -> dict[str, Any]:
    """The canonical table back in the shape lark's ``ParseTable.deserialize`` reads."""
    return {"tokens": dict(enumerate(table["tokens"])),
            "states": {i: {t: (action, arg) for t, action, arg in row} for i, row in enumerate(table["states"])},
            "start_states": dict(table["start_states"]), "end_states": dict(table["end_states"])}


def _memo_from_json(memo: list[Any]) -> dict[int, Any]:
    for entry in memo:  # JSON has no tuples; lark keeps a rule's placeholder positions in one
        if entry.get("__type__") == "Rule":
            entry["options"]["empty_indices"] = tuple(entry["options"]["empty_indices"])
    return dict(enumerate(memo))


def _serialized(parser: Lark) -> tuple[dict[str, Any], dict[int, Any]]:
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    data["options"] = {k: v for k, v in data["options"].items() if k != "transformer"}
    return data, memo


def render(grammar: str) -> str:
    """The tables file for ``grammar``: a header line, then the tables, both JSON."""
    data, memo = _serialized(Lark(grammar, **OPTIONS))
    assert sorted(memo) == list(range(len(memo))), "lark numbers memoised objects 0..n-1"
    data["parser"]["parser"] = _canonical_table(data["parser"]["parser"])
    body = json.dumps({"data": data, "memo": [memo[i] for i in range(len(memo))]},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return json.dumps(_header(grammar, body), sort_keys=True) + "\n" + body + "\n"


def _parse_tables(text: str, grammar: str) -> tuple[dict[str, Any], dict[int, Any]] | None:
    """The tables in ``text`` if its header matches ``grammar``, these options and this lark; else None."""
    head, sep, body = text.partition("\n")
    if not sep or not body.endswith("\n"):
        return None
    body = body[:-1]
    try:
        header = json.loads(head)
    except ValueError:
        return None
    if header != _header(grammar, body):
        return None
    loaded = json.loads(body)
    data, memo = loaded["data"], _memo_from_json(loaded["memo"])
    data["parser"]["parser"] = _lark_table(data["parser"]["parser"])
    return data, memo


def shipped_text() -> str | None:
    try:
        return resources.files("blockir.frontend").joinpath(TABLES_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def load_lark(transformer: Any = None) -> Lark:
    """The parser for ``block.lark`` with ``transformer`` inline: from the shipped tables when they were
    built from this grammar with this lark, else built from the grammar."""
    grammar = grammar_text()
    text = shipped_text()
    tables = _parse_tables(text, grammar) if text is not None else None
    if tables is None:
        return Lark(grammar, transformer=transformer, _plugins=PLUGINS, **OPTIONS)
    data, memo = tables
    return Lark._load_from_dict(data, memo, transformer=transformer, _plugins=PLUGINS)
