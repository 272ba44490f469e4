"""A whole causal LM: token embedding, a stack of layers, the final norm and the head, read from one run.

A causal LM's own forward builds masks, position ids and rotary tables — none of it residual code,
and none of it traceable symbolically — so the lift does not trace it. It runs the model once on the
token ids and reads the data flow of its submodules' calls: the submodule that reads the ids and
holds one ``[V, D]`` table is the embedding; the layers of one indexed list, called in order, each
reading what the one before returned (the first what the embedding returned), are the stack; the
submodule called on the last layer's result is the final norm; the one called on the norm's result
with a ``[V, D]`` matrix is the head, tied when it holds the embedding's very tensor. A second table
called on the positions 0..S-1 whose lookup the model adds to the tokens' is a learned position
embedding (GPT-2's ``wpe``); submodules without parameters called on the stream before the first layer
(the dropout of that sum) are read by the rule table, like the final norm. Each layer is
lifted as a block of its own (its branches must then compute their own masks and rotary tables:
built-ins do, externs would need the model's); the norm is read by the rule table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from blockir.diagnostics import Diagnostic, Span, error
from blockir.lift.blocks import Session
from blockir.lift.lifter import Instance, LiftedBlock, Line
from blockir.lift.trace import Call, bind_call


@dataclass
class Record:
    name: str
    module: nn.Module
    call: Call
    output: Any


def _record(model: nn.Module, args: tuple, kwargs: dict) -> tuple[Any, list[Record]]:
    """Every submodule call of one run, in the order the calls finished, with its arguments and result."""
    out: list[Record] = []
    handles = []
    for name, sub in model.named_modules():
        if not name:
            continue

        def hook(m: nn.Module, a: tuple, kw: dict, result: Any, name: str = name) -> None:
            out.append(Record(name, m, bind_call(m, a, kw), result))
        handles.append(sub.register_forward_hook(hook, with_kwargs=True))
    try:
        result = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return result, out


def _first(v: Any) -> Any:
    while isinstance(v, (tuple, list)) and v:
        v = v[0]
    return v


def _reads(r: Record, value: Tensor) -> bool:
    """Does the call take ``value`` as an argument (itself, or a view holding the same numbers)?"""
    for a in r.call.arguments.values():
        if a is value or isinstance(a, Tensor) and a.shape == value.shape and a.dtype == value.dtype and \
                torch.equal(a, value):
            return True
    return False


def _lookup(r: Record) -> Tensor | None:
    """The integer tensor a call reads, when it reads exactly one tensor and that is integer (a table lookup)."""
    tensors = [v for v in r.call.arguments.values() if isinstance(v, Tensor)]
    return tensors[0] if len(tensors) == 1 and not tensors[0].is_floating_point() else None


def _scale(embed: Record, ids: Tensor) -> str | None | bool:
    """None when the embedding returns its table's rows; the constant it multiplies them by, as the shortest
    decimal of that float in the table's dtype; False for anything else."""
    table = _table(embed.module)
    assert table is not None
    rows = torch.nn.functional.embedding(ids, table).detach()
    out = embed.output.detach()
    if out.shape != rows.shape or out.dtype != rows.dtype:
        return False
    if torch.equal(out, rows):
        return None
    k = int(rows.abs().argmax())
    c = (out.flatten()[k] / rows.flatten()[k]).item()
    for digits in range(1, 18):
        text = f"{c:.{digits}g}"
        if torch.equal(rows * torch.tensor(float(text), dtype=rows.dtype), out):
            return text
    return False


def _table(m: nn.Module) -> Tensor | None:
    params = dict(m.named_parameters())
    w = params.get("weight")
    return w if set(params) <= {"weight", "bias"} and w is not None and w.ndim == 2 else None


class LMFailure(Exception):
    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass
class LM:
    """The recovered pieces: their paths, the lifted layers and the norm's declaration."""

    embed: str
    head: str
    layers: list[tuple[str, LiftedBlock]]
    norm: str
    norm_text: str
    vocab: int
    tied: bool
    head_bias: bool
    padding_idx: int | None
    scale: str | None = None  # the constant the embedding multiplies its rows by (Gemma's sqrt(D))
    positions: str | None = None  # the learned position table's path
    before: tuple[str, ...] = ()  # the operations on the embedded stream before the first layer, on ``{0}``


def read_lm(model: nn.Module, ids: Tensor, args: tuple, kwargs: dict, where: Span) -> tuple[LM, Session]:
    """The pieces of a causal LM from one run on ``ids``; LMFailure (E0913) names the piece not found."""
    def fail(message: str, hint: str) -> LMFailure:
        return LMFailure(error("E0913", message, where, hint=hint))

    _, records = _record(model, args, kwargs)
    embed = next((r for r in records if _reads(r, ids) and _table(r.module) is not None and
                  set(dict(r.module.named_parameters())) == {"weight"}), None)
    if embed is None or not isinstance(embed.output, Tensor) or embed.output.dim() != 3:
        raise fail("no submodule of the model reads the token ids with one [V, D] table",
                   "lift a model whose embedding is a submodule called on the ids")
    state, width = embed.output, int(embed.output.shape[-1])
    seq = int(ids.shape[1])
    scale = _scale(embed, ids)
    if scale is False:
        raise fail(f"the embedding '{embed.name}' returns something other than its table's rows, or a constant "
                   "times them", "compute anything else on the embeddings outside the embedding module")
    positions = next((r for r in records if r is not embed and _table(r.module) is not None and
                      set(dict(r.module.named_parameters())) == {"weight"} and _lookup(r) is not None and
                      isinstance(r.output, Tensor) and r.output.shape[-1:] == state.shape[-1:] and
                      not _reads(r, ids) and any(_reads(u, state + r.output) for u in records)), None)
    if positions is not None:
        looked_up = _lookup(positions)
        assert looked_up is not None
        if looked_up.numel() % seq or \
                not torch.equal(looked_up.reshape(-1, seq), torch.arange(seq).expand(looked_up.numel() // seq, -1)):
            raise fail(f"the position table '{positions.name}' is not read at the positions 0..S-1",
                       "lift a model whose position embedding looks up each sequence's positions from 0")
        state = state + positions.output
    before: list[Record] = []
    for r in records:  # outside the layers (no indexed part in its path), in the order of the calls
        if r is not embed and r is not positions and not any(True for _ in r.module.parameters()) and \
                not any(part.isdigit() for part in r.name.split(".")) and _reads(r, state) and \
                isinstance(r.output, Tensor) and r.output.shape == state.shape:
            before.append(r)
            state = r.output
    layers: list[Record] = []
    for r in records:
        parent, _, index = r.name.rpartition(".")
        want = f"{layers[0].name.rpartition('.')[0]}.{len(layers)}" if layers else None
        if index.isdigit() and (r.name == want or not layers and index == "0") and _reads(r, state):
            layers.append(r)
            state = _first(r.output)
    if not layers:
        raise fail("no list of layers reads what the embedding returns",
                   "the layers must run one after the other on the embedding's result, in an nn.ModuleList")
    last = layers[-1].name.rpartition(".")[0] + "."
    after = records[records.index(layers[-1]) + 1:]
    norm = next((r for r in after if not r.name.startswith(last) and _reads(r, state) and
                 _table(r.module) is None), None)
    if norm is None:
        raise fail("no final norm reads what the last layer returns", "apply the final norm to the stack's result")
    head = next((r for r in after if _reads(r, _first(norm.output)) and _table(r.module) is not None), None)
    if head is None or int(_table(head.module).shape[1]) != width:  # type: ignore[union-attr]
        raise fail("no head with a [V, D] matrix reads what the final norm returns",
                   "project the normalized state to the vocabulary with a linear head")
    table = _table(embed.module)
    assert table is not None
    calls: dict[str, Call] = {}
    for r in records:  # a leaf's call finishes before the next one starts: this is call order, first call kept
        calls.setdefault(r.name, r.call)
    session = Session(calls, width, seq)
    session.vocab = int(table.shape[0])
    if positions is not None:
        session.positions = int(_table(positions.module).shape[0])  # type: ignore[union-attr]
    steps = tuple(_step(r, session, where) for r in before)
    lifted = [(r.name, session.lift_block(r.module, r.call, r.name + ".", {})) for r in layers]
    norm_text = _norm_text(norm, session, where)
    head_w = _table(head.module)
    bias = getattr(head.module, "bias", None) is not None
    padding = getattr(embed.module, "padding_idx", None)
    return LM(embed.name, head.name, lifted, norm.name, norm_text, int(table.shape[0]), head_w is table, bias,
              padding if isinstance(padding, int) else None, scale or None, positions.name if positions else None,
              steps), session


class _Held(nn.Module):
    """The final norm alone, held under one name so that its gain has an owner to be named by."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.held = norm

    def forward(self, x: Tensor) -> Tensor:
        return self.held(x)


def certify_lm(program: Any, root: str, model: nn.Module, ids: Tensor, args: tuple, kwargs: dict,
               bind: dict[str, Any], where: Span) -> tuple[float | None, list[Diagnostic]]:
    """The compiled lift against the model on the ids: the logits and the gradient of every parameter."""
    from blockir.lower.compile import compile
    from blockir.lift.certificate import evaluating, _rel

    compiled = compile(program, root, dims={"B": int(ids.shape[0]), "S": int(ids.shape[1])}, bind=bind)
    state = model.state_dict()
    own = set(compiled.state_dict())
    if own != set(state):
        listed = ", ".join(sorted(own ^ set(state))[:6])
        return None, [error("E0908", f"the original state_dict does not load strictly into the lift: {listed}", where,
                            hint="every parameter must sit in a recognised norm, gain or branch submodule")]
    compiled.load_state_dict(state, strict=True)
    with evaluating(model, compiled):
        out = model(*args, **kwargs)
        ref = out if isinstance(out, Tensor) else getattr(out, "logits", None)  # litgpt returns the logits
        got = compiled(ids)
    if not isinstance(ref, Tensor):
        return None, [error("E0913", "the model returns no logits to compare", where,
                            hint="lift a causal LM that returns its logits, or an output with .logits")]
    worst = _rel(got, ref)
    cotangent = torch.randn(ref.shape, generator=torch.Generator().manual_seed(0), dtype=ref.dtype)
    p_ref, p_got = dict(model.named_parameters()), dict(compiled.named_parameters())
    keys = [k for k in p_ref if k in p_got and p_ref[k].requires_grad]
    g_ref = torch.autograd.grad(ref, [p_ref[k] for k in keys], cotangent, allow_unused=True)
    g_got = torch.autograd.grad(got, [p_got[k] for k in keys], cotangent, allow_unused=True)
    for a, b in zip(g_got, g_ref):
        if (a is None) != (b is None):
            worst = max(worst, 1.0)
        elif a is not None and b is not None:
            worst = max(worst, _rel(a, b))
    return worst, []


def _alone(r: Record, session: Session) -> LiftedBlock:
    """The submodule lifted on its own, held as ``held``, by the rule table: its one declaration or operation."""
    x = next(v for v in r.call.arguments.values() if isinstance(v, Tensor))
    held = _Held(r.module)
    calls = {"held": r.call} | {f"held.{k[len(r.name) + 1:]}": c for k, c in session.calls.items()
                                if k.startswith(r.name + ".")}
    inner = Session(calls, session.width, session.seq)
    return inner.lift_block(held, bind_call(held, (x,), {}), "", {})


def _norm_text(norm: Record, session: Session, where: Span) -> str:
    block = _alone(norm, session)
    eqs = [e for e in block.eqs if isinstance(e, Line)]
    if list(block.decls) != ["held"] or len(eqs) != 1 or len(block.eqs) != 1:
        raise LMFailure(error("E0913", f"the final norm '{norm.name}' is not one norm the rule table reads", where,
                              hint="use one norm module as the final norm"))
    return block.decls["held"].text


def _step(r: Record, session: Session, where: Span) -> str:
    """A parameterless submodule on the embedded stream (a dropout) as one operation on ``{0}``."""
    block = _alone(r, session)
    eqs = [e for e in block.eqs if isinstance(e, Line)]
    if block.decls or len(eqs) != 1 or len(block.eqs) != 1 or " = " not in eqs[0].text:
        raise LMFailure(error("E0913", f"'{r.name}', called on the embedded stream before the first layer, is not "
                              "one operation the rule table reads", where,
                              hint="apply at most a dropout to the embeddings before the layers"))
    return re.sub(r"\bx\b", "{0}", eqs[0].text.split(" = ", 1)[1])


def lm_block(lm: LM, name: str, module: nn.Module) -> LiftedBlock:
    """The root ``model``: ``head(norm(layers(embed(ids))))`` with each declaration under its own path."""
    root = LiftedBlock(name, module, [("ids", ("B", "S"))], params=[])
    span = None
    pad = f", padding_idx={lm.padding_idx}" if lm.padding_idx is not None else ""
    pad += f", scale={lm.scale}" if lm.scale is not None else ""
    root.decls[lm.embed] = Line(f"embedding(V, D{pad})", span)
    root.decls[lm.norm] = Line(lm.norm_text, span)
    head = "true" if lm.tied else "false"
    root.decls[lm.head] = Line(f"head(V, tied={head}{', bias=true' if lm.head_bias else ''})", span)
    if lm.positions is not None:
        root.decls[lm.positions] = Line("embedding(P, D, positions=true)", span)
    root.eqs.append(Line(f"embedded = {lm.embed}(ids)", span))
    state = "embedded"
    if lm.positions is not None:
        root.eqs.append(Line(f"positioned = embedded + {lm.positions}(ids)", span))
        state = "positioned"
    for i, step in enumerate(lm.before):
        root.eqs.append(Line(f"embedded_{i + 1} = {step.format(state)}", span))
        state = f"embedded_{i + 1}"
    for i, (path, block) in enumerate(lm.layers):
        root.eqs.append(Instance(path, block, f"layer_{i}", (state,), Line("", span)))
        state = f"layer_{i}"
    root.eqs.append(Line(f"normed = {lm.norm}({state})", span))
    root.eqs.append(Line(f"logits = {lm.head}(normed)", span))
    root.result = "logits"
    root.output = ("B", "S", "V")
    return root
