"""Checkpoint migration between two graphs: the reviewed key map, the key plan, and the function check.

A migration moves a trained state from a source graph to a candidate graph. Three facts decide
whether it may claim anything:

- the **key map** (YAML, reviewed by a person): which source keys are renamed, transposed,
  reshaped or dropped; a pattern ``{name}`` stands for one dotted key segment
  (``layers.{i}.attn_norm.weight``), so one line covers a stack;
- the **key plan**: every candidate key is either carried from exactly one source key (after the
  map) with the candidate's shape, or new; every source key is carried or dropped by the map.
  Nothing is guessed: a key the map does not account for is an error at its declaration;
- the **function check**: the two graphs compared in the canonical form ``blockir diff`` uses
  (:mod:`blockir.analyses.equivalence`: declaration and value names left out, constants folded,
  calls compared through the blocks they call; a rename is not a change of function, a moved
  norm is). ``same``: the graphs compute one function, so a
  conversion may claim zero error (a numerical check still has to confirm it). ``extends``: the
  candidate is the source plus learned scales on new state (LayerScale, ReZero gates): the new
  state is initialised by its declaration and changes the function by that much. ``changes``:
  anything else (Pre-LN → Post-LN, RMSNorm → DyT, new constants): no conversion of it can claim
  zero error; its evidence is training.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import yaml

from blockir.analyses.block_queries import has
from blockir.analyses.equivalence import compare
from blockir.analyses.keys import Key
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.decls import ExternDecl, KindDecl
from blockir.ir.printer import format_decl, format_op
from blockir.ir.program import Block, Program
from blockir.ir.traits import Scales
from blockir.ops import Op

Shape = tuple[int, ...]
SECTIONS = ("rename", "transpose", "reshape", "drop")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml bounds the nesting depth, and is fast
LEARNED_SCALES = ("scalar", "vector")


def map_error(message: str, span: Span, hint: str | None = None) -> BlockError:
    return BlockError([error("E0727", message, span, hint=hint)])


# --- the reviewed key map ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    pattern: str
    target: str  # the renamed key (rename), else the pattern itself
    span: Span

    def matcher(self) -> re.Pattern[str]:
        parts = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", self.pattern)
        # literal text alternates with placeholder names; a placeholder is one dotted segment
        regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^.]+)" for i, p in enumerate(parts))
        return re.compile(regex + r"\Z")

    def apply(self, key: str) -> str | None:
        m = self.matcher().match(key)
        return None if m is None else self.target.format(**m.groupdict())


@dataclass(frozen=True)
class KeyMap:
    filename: str
    sha256: str
    rename: tuple[Rule, ...] = ()
    transpose: tuple[Rule, ...] = ()
    reshape: tuple[Rule, ...] = ()
    drop: tuple[Rule, ...] = ()


def _span(filename: str, node: yaml.Node) -> Span:
    return Span(filename, node.start_mark.line + 1, node.start_mark.column + 1)


def _scalar(filename: str, node: yaml.Node, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode) or not str(node.value).strip():
        raise map_error(f"{what} must be a key name or pattern", _span(filename, node))
    return str(node.value)


def _checked_pattern(filename: str, node: yaml.Node, text: str, names: set[str] | None = None) -> None:
    placeholders = re.findall(r"\{([^{}]*)\}", text)
    used = set(placeholders)
    bad = [n for n in used if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]
    if bad or "{" in re.sub(r"\{[^{}]*\}", "", text) or "}" in re.sub(r"\{[^{}]*\}", "", text):
        raise map_error(f"'{text}' is not a key pattern: placeholders are {{name}}", _span(filename, node))
    if names is None and len(placeholders) != len(used):
        twice = sorted(n for n in used if placeholders.count(n) > 1)
        raise map_error(f"'{text}' binds {', '.join(twice)} more than once; a source pattern names each segment "
                        "once", _span(filename, node), "give each placeholder its own name ({i}, {j})")
    if names is not None and not used <= names:
        raise map_error(f"'{text}' uses {', '.join(sorted(used - names))}, which its source pattern does not bind",
                        _span(filename, node))


def parse_key_map(text: str, filename: str) -> KeyMap:
    """A key map from YAML text; every error is located in the map file."""
    try:
        root = yaml.compose(text, Loader=LOADER)
    except RecursionError:
        raise map_error("the key map nests deeper than a key map can", Span(filename, 1, 1)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        span = Span(filename, mark.line + 1, mark.column + 1) if mark is not None else Span(filename, 1, 1)
        raise map_error(f"the key map is not valid YAML: {getattr(exc, 'problem', None) or exc}", span) from None
    sha = hashlib.sha256(text.encode()).hexdigest()
    if root is None:
        return KeyMap(filename, sha)
    if not isinstance(root, yaml.MappingNode):
        raise map_error(f"a key map is a mapping with sections {', '.join(SECTIONS)}", _span(filename, root))
    sections: dict[str, list[Rule]] = {s: [] for s in SECTIONS}
    seen: set[str] = set()
    for key_node, value in root.value:
        section = _scalar(filename, key_node, "a section name")
        if section not in SECTIONS:
            raise map_error(f"unknown section '{section}' (sections: {', '.join(SECTIONS)})", _span(filename, key_node))
        if section in seen:
            raise map_error(f"section '{section}' appears twice; YAML would keep only one of them",
                            _span(filename, key_node), "merge the two sections into one")
        seen.add(section)
        if section == "rename":
            if not isinstance(value, yaml.MappingNode):
                raise map_error("rename maps source keys to candidate keys: 'old.key: new.key'", _span(filename, value))
            for k, v in value.value:
                source, target = _scalar(filename, k, "a source key"), _scalar(filename, v, "a candidate key")
                _checked_pattern(filename, k, source)
                _checked_pattern(filename, v, target, set(re.findall(r"\{([^}]*)\}", source)))
                if any(r.pattern == source for r in sections[section]):
                    raise map_error(f"'{source}' is renamed twice", _span(filename, k), "keep one of the two lines")
                sections[section].append(Rule(source, target, _span(filename, k)))
        else:
            if not isinstance(value, yaml.SequenceNode):
                raise map_error(f"{section} lists source keys: '{section}: [key, …]'", _span(filename, value))
            for item in value.value:
                pattern = _scalar(filename, item, "a source key")
                _checked_pattern(filename, item, pattern)
                sections[section].append(Rule(pattern, pattern, _span(filename, item)))
    return KeyMap(filename, sha, *(tuple(sections[s]) for s in SECTIONS))


# --- the key plan ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Move:
    target: str
    source: str
    transpose: bool
    reshape: bool


@dataclass(frozen=True)
class KeyPlan:
    moves: tuple[Move, ...]  # candidate keys carried from a source key
    new: tuple[str, ...]  # candidate keys with no source: initialised by their declaration
    dropped: tuple[str, ...]  # source keys the map drops

    @property
    def renamed(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.source != m.target)


def _first(rules: tuple[Rule, ...], key: str, used: set[int]) -> Rule | None:
    for r in rules:
        if r.matcher().match(key):
            used.add(id(r))
            return r
    return None


def plan_keys(source: Mapping[str, Shape], target: Mapping[str, Shape], keymap: KeyMap | None,
              locate: Callable[[str], Span], locate_source: Callable[[str], Span]) -> KeyPlan:
    """Which source key each candidate key is carried from, and with what transform.

    ``locate(key)`` / ``locate_source(key)`` give the declaration that owns a candidate / source key,
    where an error about it is reported.
    """
    km = keymap or KeyMap("", "")
    used: set[int] = set()
    carried: dict[str, tuple[str, bool, bool]] = {}
    dropped: list[str] = []
    for key, shape in source.items():
        if _first(km.drop, key, used) is not None:
            dropped.append(key)
            continue
        rule = _first(km.rename, key, used)
        name = rule.apply(key) if rule is not None else key
        assert name is not None
        if name in carried:
            raise map_error(f"source keys '{carried[name][0]}' and '{key}' are both mapped to '{name}'",
                            rule.span if rule is not None else locate_source(key))
        if name not in target:
            if rule is not None:
                raise map_error(f"'{key}' is renamed to '{name}', which the candidate does not have", rule.span,
                                "rename it to a key of the candidate (blockir keys DST.block), or drop it")
            raise map_error(f"source key '{key}' has no place in the candidate: the map neither renames nor drops it",
                            locate_source(key), "add it to the map's rename or drop section")
        transpose = _first(km.transpose, key, used) is not None
        reshape = _first(km.reshape, key, used) is not None
        shape_after = tuple(reversed(shape)) if transpose else tuple(shape)
        if transpose and len(shape) != 2:
            raise map_error(f"'{key}' has shape {list(shape)}; only a matrix can be transposed",
                            next(r.span for r in km.transpose if r.matcher().match(key)))
        want = tuple(target[name])
        if reshape:
            if _numel(shape_after) != _numel(want):
                raise map_error(f"'{key}' has {_numel(shape)} elements; it cannot be reshaped to {list(want)}",
                                next(r.span for r in km.reshape if r.matcher().match(key)))
        elif shape_after != want:
            hint = "list it under transpose or reshape if the map's reviewer says so" \
                if _numel(shape_after) == _numel(want) else None
            raise map_error(f"'{key}' {list(shape)} is carried to '{name}', which the candidate declares "
                            f"{list(want)}", locate(name), hint)
        carried[name] = (key, transpose, reshape)
    for rules in (km.rename, km.transpose, km.reshape, km.drop):
        for r in rules:
            if id(r) not in used:
                raise map_error(f"'{r.pattern}' matches no key of the source checkpoint", r.span,
                                "a reviewed map names only keys it moves (blockir keys SRC.block)")
    moves = tuple(Move(k, *carried[k]) for k in target if k in carried)
    return KeyPlan(moves, tuple(k for k in target if k not in carried), tuple(dropped))


def _numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# --- the function check ------------------------------------------------------------------------------

def _strip_scales(block: Block, params: frozenset[str]) -> Block:
    """``block`` without its scale ops by the learned parameters ``params``: their readers read the unscaled value."""
    renames: dict[str, str] = {}
    ops: list[Op] = []
    for op in block.ops:
        if has(op, Scales) and op.param in params:
            renames[op.result] = renames.get(op.operand, op.operand)
            continue
        names = {v: renames[v] for v in op.operands if v in renames}
        ops.append(op.reading(names) if names else op)  # type: ignore[arg-type]
    return replace(block, ops=tuple(ops))


@dataclass(frozen=True)
class FunctionCheck:
    verdict: str  # "same" | "extends" | "changes"
    reason: str
    new_state: tuple[str, ...]  # "Block.decl" of the learned scales that own the new keys (extends)
    first_source: tuple[Span, str] | None = None  # the first differing op on each side (changes)
    first_target: tuple[Span, str] | None = None

    @property
    def zero_error_possible(self) -> bool:
        return self.verdict == "same"


def check_function(src: Program, a: Block, dst: Program, b: Block, new_keys: tuple[Key, ...]) -> FunctionCheck:
    """Whether ``b`` computes ``a``'s function, extends it by new learned scales, or changes it.

    ``new_keys`` are the candidate's keys the migration has no source for.
    """
    owners = {(k.block, k.decl) for k in new_keys}
    scales = {(blk, d) for blk, d in owners if blk in dst.block_map
              and isinstance(dst.block(blk).decl_map.get(d), KindDecl)
              and dst.block(blk).decl_map[d].kind in LEARNED_SCALES}  # type: ignore[union-attr]
    plain = compare(src, a, dst, b)
    if plain.same_function:
        return FunctionCheck("same", "the graphs compute one function (declaration names aside)", ())
    others = sorted({f"{blk}.{d}" if blk else d for blk, d in owners - scales})
    strip: dict[str, frozenset[str]] = {}
    for blk, d in scales:
        strip[blk] = strip.get(blk, frozenset()) | {d}

    def stripped(block: Block) -> Block:
        return _strip_scales(block, strip[block.name]) if block.name in strip else block
    if not others and scales and compare(src, a, dst, b, stripped).same_function:
        names = tuple(sorted(f"{blk}.{d}" for blk, d in scales))
        return FunctionCheck("extends", "the candidate is the source graph with new learned scales "
                             f"({', '.join(names)}), initialised by their declarations", names)
    fa, fb = ((op.span, format_op(op)) if op is not None else None for op in (plain.first_a, plain.first_b))
    if others:
        reason = f"new state that no learned scale owns: {', '.join(others)}"
    else:
        reason = "the graphs compute different functions"
    return FunctionCheck("changes", reason, (), fa, fb)


def new_state_decls(program: Program, keys: tuple[Key, ...]) -> dict[str, str]:
    """Each new key's declaration as written (its initialisation is part of it)."""
    out = {}
    for k in keys:
        decl = program.block(k.block).decl_map.get(k.decl) if k.block in program.block_map else None
        out[k.name] = format_decl(decl) if isinstance(decl, (KindDecl, ExternDecl)) else k.owner
    return out
