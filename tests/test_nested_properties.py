"""Property tests for the analyses every consumer shares.

For random residual blocks, telemetry sites, dot's spine and the verifiers'
updates come from one structure analysis and agree. For random nested
programs (sub-layers written as block instances, one or two levels deep,
some wired wrongly on purpose), verifying with block summaries reports the
same errors as inlining every call and verifying the flat block; that holds
for sub-layers that carry RealFormer score routes too, some shared across
attention families on purpose.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import networkx as nx

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blockir
from blockir.analyses.sites import residual_sites
from blockir.analyses.sizes import Sizes
from blockir.analyses.structure import wrapper
from blockir.analyses.summaries import call_graph
from blockir.ir.decls import InstanceDecl
from blockir.reports.dot import block_to_dot
from blockir.passes.inline import inline_calls
from test_structure import _spine_nodes
from test_transform_properties import programs

SETTINGS = settings(max_examples=int(__import__("os").environ.get("BLOCKIR_PROPERTY_EXAMPLES", 60)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(text=programs())
def test_sites_spine_and_updates_come_from_one_analysis(text: str) -> None:
    program = blockir.parse(text, "random.block")
    block = program.block("L")
    w = wrapper(block)
    updates = [s for s in w.sublayers if s.shortcut is not None]
    sites = residual_sites(program, block, Sizes.of(program))
    assert [s.site for s in sites] == [s.root.result for s in updates]
    assert [s.shortcut for s in sites] == [s.shortcut for s in updates]
    assert [set(s.updates) for s in sites] == [{b.leaf for b in u.branches} | set(u.updates) - {u.shortcut}
                                               for u in updates]
    assert _spine_nodes(block_to_dot(block)) == [v for v in w.spine if v in block.producers]


HEAD = """dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
dim H: heads = 2

block Norm(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  return n(x)
}

block Drop(x: [B, S, D]) -> [B, S, D] {
  return dropout(x, p=0.1)
}

block SelfSub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  sa: self_attention(heads=2, causal=CAUSAL)
  y = x + sa(n(x))
  return y
}

block CrossSub(x: [B, S, D], memory: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  ca: cross_attention(heads=2)
  y = x + ca(n(x), memory)
  return y
}

block MlpSub(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  y = x + f(n(x))
  return y
}

block ScoreSelf(x: [B, S, D], s: [B, H, S, S]) -> ([B, S, D], [B, H, S, S]) {
  n: layernorm(D)
  sa: self_attention(heads=H, causal=CAUSAL, score_residual=sum)
  a, s_next = sa(n(x), s)
  y = x + a
  return y, s_next
}

block ScoreCross(x: [B, S, D], memory: [B, S, D], s: [B, H, S, S]) -> ([B, S, D], [B, H, S, S]) {
  n: layernorm(D)
  ca: cross_attention(heads=H, score_residual=sum)
  a, s_next = ca(n(x), memory, s)
  y = x + a
  return y, s_next
}

block WrapMlp(x: [B, S, D]) -> [B, S, D] {
  inner: MlpSub
  return inner(x)
}

block PlainMlp(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D)
  f: mlp(F)
  return f(n(x))
}
"""

STEPS = st.sampled_from(["self", "cross", "cross_own", "mlp", "wrapped_mlp", "inline_mlp", "drop_branch",
                         "drop_stream", "shared_norm", "drop_shortcut", "residual_branch", "plain_stream"])
# drawn as often as all the others together, so that routes meet and are shared in most programs
SCORE_STEPS = st.sampled_from(["score_self", "score_cross", "score_cross_on_self_route"])


@st.composite
def nested_programs(draw: st.DrawFn) -> str:
    steps = draw(st.lists(st.one_of(STEPS, SCORE_STEPS), min_size=1, max_size=5))
    causal = draw(st.sampled_from(["true", "false"]))
    decls: list[str] = []
    eqs: list[str] = []
    h = "x"
    shared = False
    routes: dict[str, str] = {}  # attention family -> the value its score route holds now
    for i, step in enumerate(steps):
        out = f"h{i}"
        if step.startswith("score_"):
            cross = step != "score_self"
            route = "self" if step != "score_cross" else "cross"  # the last one reads the self route: wrong
            if route not in routes:
                routes[route] = f"z{i}"
                eqs.append(f"  z{i} = zeros([B, H, S, S])")
            decls.append(f"  r{i}: {'ScoreCross' if cross else 'ScoreSelf'}")
            eqs.append(f"  {out}, t{i} = r{i}({h}, {'memory, ' if cross else ''}{routes[route]})")
            routes[route] = f"t{i}"
        elif step == "self":
            decls.append(f"  s{i}: SelfSub")
            eqs.append(f"  {out} = s{i}({h})")
        elif step in ("cross", "cross_own"):
            decls.append(f"  c{i}: CrossSub")
            if step == "cross_own":
                decls.append(f"  m{i}: layernorm(D)")
            eqs.append(f"  {out} = c{i}({h}, {'memory' if step == 'cross' else f'm{i}({h})'})")
        elif step in ("mlp", "wrapped_mlp"):
            decls.append(f"  b{i}: {'MlpSub' if step == 'mlp' else 'WrapMlp'}")
            eqs.append(f"  {out} = b{i}({h})")
        elif step == "inline_mlp":
            decls += [f"  n{i}: layernorm(D)", f"  f{i}: mlp(F)"]
            eqs.append(f"  {out} = {h} + f{i}(n{i}({h}))")
        elif step == "drop_branch":
            decls += [f"  d{i}: Drop", f"  n{i}: layernorm(D)", f"  f{i}: mlp(F)"]
            eqs.append(f"  {out} = {h} + d{i}(f{i}(n{i}({h})))")
        elif step == "drop_shortcut":
            decls += [f"  d{i}: Drop", f"  n{i}: layernorm(D)", f"  f{i}: mlp(F)"]
            eqs.append(f"  {out} = d{i}({h}) + f{i}(n{i}({h}))")
        elif step == "residual_branch":
            decls.append(f"  b{i}: MlpSub")
            eqs.append(f"  {out} = {h} + b{i}({h})")
        elif step == "plain_stream":
            decls.append(f"  p{i}: PlainMlp")
            eqs.append(f"  {out} = p{i}({h})")
        elif step == "drop_stream":
            decls += [f"  d{i}: Drop", f"  n{i}: layernorm(D)", f"  f{i}: mlp(F)"]
            eqs += [f"  t{i} = d{i}({h})", f"  {out} = t{i} + f{i}(n{i}(t{i}))"]
        else:
            if not shared:
                decls.append("  shared: Norm")
                shared = True
            decls.append(f"  f{i}: mlp(F)")
            eqs.append(f"  {out} = {h} + f{i}(shared({h}))")
        h = out
    body = "\n".join(decls + eqs + [f"  return {h}"])
    return HEAD.replace("CAUSAL", causal) + \
        f"\nblock Top(x: [B, S, D], memory: [B, S, D]) -> [B, S, D] {{\n{body}\n}}\n"



def _flat(program: blockir.ir.Program, name: str) -> blockir.ir.Program:
    changed = True
    while changed:
        program, changed = inline_calls(program, name)
    return program


def _only(program: blockir.ir.Program, names: set[str]) -> blockir.ir.Program:
    return dataclasses.replace(program, blocks=tuple(b for b in program.blocks if b.name in names))


def _errors(program: blockir.ir.Program) -> Counter[str]:
    return Counter(d.code for d in blockir.verify(program) if d.is_error)


@SETTINGS
@given(text=nested_programs())
def test_summaries_report_what_inlining_reports(text: str) -> None:
    nested = blockir.parse(text, "nested.block")
    flat = _only(_flat(nested, "Top"), {"Top"})
    used = {"Top"} | nx.descendants(call_graph(nested), "Top")
    assert not any(isinstance(d, InstanceDecl) for d in flat.block("Top").decls)
    assert _errors(_only(nested, used)) == _errors(flat), text
