"""The lifted blocks of one module tree and their ``.block`` text, with a map from every line back
to the Python that produced it.

A layer (an indexed residual container) is lifted as a block of its own; consecutive layers of one
list whose blocks read alike become one stack ``NAME: Block * N``.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from blockir.diagnostics import Diagnostic, Span, warning
from blockir.frontend.scope import RESERVED
from blockir.lift.lifter import Instance, LiftedBlock, Lifter, Line, check_signature
from blockir.lift.replay import Replay, Slot
from blockir.lift.trace import Call, trace
from blockir.lower.declared import DEPTH_ATTR, FACTS_ATTR, INIT_ATTR
from blockir.norms.base import number as number_text

DIMS = ("B", "S", "T", "D", "V", "P")
KEYWORDS = ("return", "const", "dim", "extern", "true", "false", "block", "model")




@dataclass
class Entry:
    """What one line of the lifted text is: a declaration, an equation, a header or a return."""

    kind: str
    line: Line


class Session:
    """What the blocks of one lift share: the recorded calls, the dims and the block names."""

    def __init__(self, calls: dict[str, Call], width: int, seq: int, context: dict[str, Any] | None = None,
                 seq_names: tuple[str, str] = ("S", "T")) -> None:
        self.calls = calls
        self.context = context or {}
        self.vocab: int | None = None  # a whole LM's vocabulary size
        self.positions: int | None = None  # the rows of its learned position table
        self.width, self.seq = width, seq
        self.seq_names = seq_names  # the stream's sequence axis, and every other's
        self.hidden: dict[int, str] = {}
        self.model: dict[int, str] = {}  # widths of joined states (a concat of D-wide states), model axes
        self.memory: dict[int, str] = {}
        self.reserved = {*DIMS, *KEYWORDS, *RESERVED}
        self.names: dict[str, str] = {}  # block body → block name
        self.used_memory = False
        self.findings: list[Diagnostic] = []  # what the lift itself finds wrong (E0909)
        self.residual: dict[int, bool] = {}  # module id → is it a residual container

    def dim(self, size: int) -> str:
        if size == self.width:
            return "D"
        if size in self.model:
            return self.model[size]
        if size not in self.hidden:
            self.hidden[size] = "F" if not self.hidden else f"F{len(self.hidden) + 1}"
            self.reserved.add(self.hidden[size])
        return self.hidden[size]

    def joined(self, size: int) -> None:
        """A width that joined states have: a model axis ``E`` (``E2``…), unless it is one already."""
        if size != self.width and size not in self.model:
            self.model[size] = "E" if not self.model else f"E{len(self.model) + 1}"
            self.reserved.add(self.model[size])

    def axes(self, shape: tuple[int, ...]) -> tuple[str, ...]:
        if shape[1] == self.seq:
            seq = self.seq_names[0]
        else:
            self.used_memory = True
            seq = self.seq_names[1]
        return ("B", seq, self.dim(shape[2]))

    def lift_block(self, module: nn.Module, call: Call, prefix: str, ctx: dict[str, Slot]) -> LiftedBlock:
        check_signature(module)
        traced = trace(module, call, self.calls, prefix, self.residual)
        base = re.sub(r"\W", "_", type(module).__name__) or "Block"
        lifter = Lifter(self, traced, prefix, ctx, base)
        lifter.taken |= {n for n, _ in module.named_modules() if n} | {n for n, _ in module.named_parameters()}
        block = lifter.run()
        _restore_init(block, module)
        block.consts = [*getattr(module, FACTS_ATTR, ()), *block.consts]
        for name, expr, span, value in getattr(module, DEPTH_ATTR, ()):
            if f"{name} = {expr}" in block.consts:
                continue
            self.findings.append(warning(
                "W0920", f"'{block.name}' uses {name} = {expr}, which depends on the layer or the stack's depth: the "
                f"trace shows only its value in this compiled layer, {number_text(value)}, and the lift writes that "
                "number", span,
                hint="the lifted block is this layer at this depth; state the constant again to reuse it at another"))
        self.name(block, base)
        return block

    def name(self, block: LiftedBlock, base: str) -> None:
        """Blocks that read alike share one name, ``base`` or the first free ``base_N``."""
        body = block.body()
        if body not in self.names:
            name, i = base, 1
            while name in self.reserved:
                i += 1
                name = f"{base}_{i}"
            self.reserved.add(name)
            self.names[body] = name
        block.name = self.names[body]


@dataclass
class Text:
    """The lifted program text and the origin of each of its lines (1-based)."""

    text: str
    entries: dict[int, Entry] = field(default_factory=dict)
    bind: dict[str, tuple[nn.Module, Replay]] = field(default_factory=dict)
    root: str = ""


def _return_span(module: nn.Module) -> Span | None:
    try:
        lines, start = inspect.getsourcelines(type(module).forward)
        path = inspect.getsourcefile(type(module)) or "?"
    except (OSError, TypeError):
        return None
    for i in range(len(lines) - 1, -1, -1):
        stripped = lines[i].lstrip()
        if stripped.startswith("return"):
            col = len(lines[i]) - len(stripped) + 1
            return Span(path, start + i, col, len(lines[i].rstrip()) + 1)
    return None


def _restore_init(block: LiftedBlock, module: nn.Module) -> None:
    """A compiled block's init-only arguments, which its trace does not show, on the declarations it lifted to the
    same kind (:mod:`blockir.lower.declared`)."""
    for name, (kind, args) in getattr(module, INIT_ATTR, {}).items():
        line = block.decls.get(name)
        if line is not None and line.text.startswith(kind + "("):
            line.text = f"{line.text[:-1]}, {args})"


def _header_span(module: nn.Module) -> Span | None:
    try:
        lines, start = inspect.getsourcelines(type(module))
        path = inspect.getsourcefile(type(module)) or "?"
    except (OSError, TypeError):
        return None
    return Span(path, start, 1, len(lines[0].rstrip()) + 1)


def _stacks(block: LiftedBlock) -> list[Any]:
    """The equations with each chain of layers ``P.0 … P.(N-1)`` of one block folded into a stack."""
    eqs = block.eqs
    out: list[Any] = []
    i = 0
    while i < len(eqs):
        e = eqs[i]
        run = [e] if isinstance(e, Instance) and e.decl.endswith(".0") else []
        parent = e.decl[:-2] if run else ""
        while run and i + len(run) < len(eqs):
            nxt = eqs[i + len(run)]
            prev = run[-1]
            if not (isinstance(nxt, Instance) and nxt.decl == f"{parent}.{len(run)}" and nxt.block.name == prev.block.name
                    and nxt.inputs[:1] == (prev.result,) and nxt.inputs[1:] == prev.inputs[1:]):
                break
            run.append(nxt)
        inside = {r.result for r in run[:-1]}
        others = [x for x in eqs if x not in run]
        used = any(re.search(rf"\b{re.escape(v)}\b", x.line.text if isinstance(x, Instance) else x.text)
                   or isinstance(x, Instance) and v in x.inputs for v in inside for x in others) or \
            block.result in inside
        if len(run) > 1 and not used:
            out.append(("stack", parent, run))
            i += len(run)
        else:
            out.append(e)
            i += 1
    return out


def _in_use_order(block: LiftedBlock) -> list[tuple[str, Line]]:
    """Declarations in the order the equations first apply them (the walk met them result first)."""
    def first(name: str) -> int:
        pat = re.compile(rf"(?<![\w.]){re.escape(name)}\b(?!\.)")
        return next((i for i, e in enumerate(block.eqs) if isinstance(e, Line) and pat.search(e.text)), len(block.eqs))
    return sorted(block.decls.items(), key=lambda kv: first(kv[0]))


def emit(root: LiftedBlock, session: Session, root_module: nn.Module) -> Text:
    """The whole program: dims, then every block after the blocks it calls."""
    lines: list[str] = []
    out = Text("")
    done: set[str] = set()

    def add(text: str, kind: str = "", line: Line | None = None) -> None:
        lines.append(text)
        if line is not None:
            out.entries[len(lines)] = Entry(kind, line)

    def write(block: LiftedBlock, prefix: str, is_root: bool) -> None:
        items = _stacks(block)
        for path, (module, replay) in block.externs.items():
            out.bind[prefix + path] = (module, replay)
        for item in items:
            if isinstance(item, Instance):
                write(item.block, f"{prefix}{item.decl}.", False)
            elif isinstance(item, tuple):
                for k, inst in enumerate(item[2]):
                    write(inst.block, f"{prefix}{item[1]}.{k}.", False)
        if block.name in done:
            return
        done.add(block.name)
        kind = "model" if is_root and any(not isinstance(x, Line) for x in items) else "block"
        ins = ", ".join(f"{n}: [{', '.join(a)}]" for n, a in block.inputs)
        header = Line("", _header_span(block.module))
        add(f"{kind} {block.name}({ins}) -> [{', '.join(block.output or block.inputs[0][1])}] {{", "header", header)
        for const in block.consts:
            add(f"  const {const}")
        for name, d in _in_use_order(block):
            add(f"  {name}: {d.text}", "decl", d)
        for item in items:
            if isinstance(item, tuple):
                _, parent, run = item
                add(f"  {parent}: {run[0].block.name} * {len(run)}", "decl", run[0].line)
        for item in items:
            if isinstance(item, Instance):
                add(f"  {item.decl}: {item.block.name}", "decl", item.line)
        for item in items:
            if isinstance(item, Line):
                add(f"  {item.text}", "eq", item)
            elif isinstance(item, Instance):
                add(f"  {item.result} = {item.decl}({', '.join(item.inputs)})", "eq", item.line)
            else:
                _, parent, run = item
                add(f"  {run[-1].result} = {parent}({', '.join(run[0].inputs)})", "eq", run[0].line)
        add(f"  return {block.result}", "return", Line("", _return_span(block.module) or block.result_span))
        add("}")
        add("")

    write(root, "", True)
    memory = session.used_memory or session.seq_names[0] == "T"
    dims = ["dim B: batch", "dim S: seq", *(["dim T: seq"] if memory else []),
            f"dim D: model = {session.width}", *(f"dim {n}: model = {s}" for s, n in session.model.items()),
            *(f"dim {n}: hidden = {s}" for s, n in session.hidden.items()),
            *([f"dim V: vocab = {session.vocab}"] if session.vocab else []),
            *([f"dim P: vocab = {session.positions}"] if session.positions else []), ""]
    out.text = "\n".join(dims + lines)
    out.entries = {k + len(dims): v for k, v in out.entries.items()}
    out.root = root.name
    return out
