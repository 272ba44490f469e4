"""The compiled module tree: call_module nodes, ModuleList stacks, shared per-block code, copies and fx tracing."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.fx as fx
from conftest import EXAMPLES, ROOT
from torch import Tensor, nn

import blockir
from blockir.analyses.keys import param_keys
from blockir.lower import fx as bfx
from blockir.lower.boundary import check_inputs
from blockir.lower.fx import module as generated
from blockir.norms.rmsnorm import rms_norm
from blockir.lower.layers.rotary import rope_cos_sin

LLAMA = ROOT / "examples" / "llama.block"
HEADER = "dim B: batch\ndim S: seq\ndim D: model = 8\ndim F: hidden = 16\ndim H: heads = 2\n"


def _x(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _compile(body: str, name: str, **kwargs: object) -> bfx.BlockModule:
    return blockir.compile(blockir.parse(HEADER + body, "t.block"), name, seed=0, **kwargs)


def _stack(n: int, layer_body: str = "  n: rmsnorm(D)\n  m: mlp(F)\n  y = x + m(n(x))") -> str:
    return (f"block L(x: [B, S, D]) -> [B, S, D] {{\n{layer_body}\n  return y\n}}\n"
            f"model M(x: [B, S, D]) -> [B, S, D] {{\n  layers: L * {n}\n  norm: rmsnorm(D)\n"
            f"  return norm(layers(x))\n}}\n")


def _llama_ctx() -> dict[str, object]:
    mask = torch.zeros(2, 1, 5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    mask[1, :, :, -1] = float("-inf")
    return {"attention_mask": mask, "position_embeddings": rope_cos_sin(5, 16, 10000.0, torch.device("cpu"),
                                                                          torch.float32)}


# ------------------------------------------------------------ the tree


def test_a_stack_is_a_module_list_of_compiled_layers() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0)
    assert isinstance(m.layers, nn.ModuleList) and isinstance(m.layers, bfx.Stack)
    assert len(m.layers) == 2
    layers = list(m.layers)
    assert layers[0] is m.layers[0] is m.get_submodule("layers.0")
    assert all(isinstance(layer, fx.GraphModule) and layer.blockir_block == "LlamaDecoderLayer" for layer in layers)
    assert [layer.blockir_layer for layer in m.layers] == [0, 1]
    # a layer runs on its own, as its stack runs it
    x = _x(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(m.norm(m.layers[1](m.layers[0](x))), m(x), rtol=0, atol=0)
        torch.testing.assert_close(m.layers(x), m.layers[1](m.layers[0](x)), rtol=0, atol=0)


def test_branches_sub_blocks_and_layers_are_call_module_nodes() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0)
    called = [n.target for n in m.graph.nodes if n.op == "call_module"]
    assert called == ["layers", "norm"]  # the stack runs its layers; the model's graph does not grow with depth
    inner = [n.target for n in m.layers[0].graph.nodes if n.op == "call_module"]
    assert inner == ["input_layernorm", "self_attn", "post_attention_layernorm", "mlp"]
    assert not [n for n in m.layers[0].graph.nodes if n.op == "get_attr"]
    code = m.layers[0].code
    for line in ("t1 = self.self_attn(t0, **context)", "t3 = self.mlp(t2, **context)"):
        assert line in code, line
    assert "t0 = self.layers(x, **context)" in m.code
    # norms, linears and activations take no context
    assert "t0 = self.input_layernorm(x)\n" in code


def test_sub_blocks_nest_at_their_declared_path() -> None:
    text = ("block Inner(x: [B, S, D]) -> [B, S, D] {\n  n: rmsnorm(D)\n  y = x + n(x)\n  return y\n}\n"
            "block Outer(x: [B, S, D]) -> [B, S, D] {\n  a.b: Inner\n  y = a.b(x)\n  return y\n}\n")
    m = _compile(text, "Outer")
    assert list(m.state_dict()) == ["a.b.n.weight"]
    assert isinstance(m.a.b, bfx.BlockModule) and m.a.b.blockir_block == "Inner"
    assert [n.target for n in m.graph.nodes if n.op == "call_module"] == ["a.b"]
    _, values = blockir.trace(m, _x(2, 3, 8))
    assert {"a.b.x", "a.b.y", "y"} <= set(values)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_state_dict_keys_are_the_declared_names(path: Path) -> None:
    """The keys ``blockir keys`` predicts from the declarations (externs bring their own)."""
    program = blockir.load(path)
    for name in program.block_map:
        table = param_keys(program, name)
        if table.unknown:
            continue
        assert set(blockir.compile(program, name, seed=0).state_dict()) == set(table.shapes), name


@pytest.mark.parametrize("name", ["TransformerEncoderLayer", "TransformerEncoderLayerNormFirst"])
def test_key_order_is_the_declaration_order_of_the_real_module(name: str) -> None:
    """Declared in the real module's order, the keys come in its order (fx's graph-use order did not)."""
    real = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, norm_first=name.endswith("NormFirst"))
    m = blockir.compile(ROOT / "examples" / "torch_encoder.block", name, bind={"self_attn": real.self_attn})
    assert list(m.state_dict()) == list(real.state_dict())


def test_unused_declarations_keep_their_state() -> None:
    m = _compile("block T(x: [B, S, D]) -> [B, S, D] {\n  n: rmsnorm(D)\n  spare: linear(D, D)\n"
                 "  y = x + n(x)\n  return y\n}\n", "T")
    assert list(m.state_dict()) == ["n.weight", "spare.weight", "spare.bias"]


# ------------------------------------------------------------ context


class _Recording(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.seen: list[dict[str, object]] = []


def _recording_adapter(module: _Recording, x: Tensor, **ctx: object) -> Tensor:
    module.seen.append(dict(ctx))
    return module.proj(x)


def test_context_reaches_externs_inside_stack_layers_and_sub_blocks() -> None:
    text = ("block Inner(x: [B, S, D]) -> [B, S, D] {\n  f: extern(x: [B, S, D]) -> [B, S, D]\n"
            "  y = x + f(x)\n  return y\n}\n"
            "block Layer(x: [B, S, D]) -> [B, S, D] {\n  inner: Inner\n  y = inner(x)\n  return y\n}\n"
            "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: Layer * 2\n  return layers(x)\n}\n")
    mods = {f"layers.{i}.inner.f": _Recording() for i in range(2)}
    m = _compile(text, "M", bind={k: (v, _recording_adapter) for k, v in mods.items()})
    assert m.get_submodule("layers.1.inner.f").bound is mods["layers.1.inner.f"]
    marker = torch.ones(1)
    m(_x(2, 3, 8), attention_mask=marker, anything="else")
    for rec in mods.values():
        assert rec.seen == [{"attention_mask": marker, "anything": "else"}]
    # trace passes the same context
    blockir.trace(m, _x(2, 3, 8), attention_mask=marker)
    assert all(rec.seen[-1] == {"attention_mask": marker} for rec in mods.values())


def test_an_extern_bound_without_adapter_gets_the_keywords_its_forward_takes() -> None:
    text = ("block T(x: [B, S, D]) -> [B, S, D] {\n  f: extern(x: [B, S, D]) -> [B, S, D]\n  y = x + f(x)\n"
            "  return y\n}\n")
    lin = nn.Linear(8, 8)
    m = _compile(text, "T", bind={"f": lin})
    x = _x(2, 3, 8)
    torch.testing.assert_close(m(x), x + lin(x))
    # Linear.forward takes no keyword: the module reads none, and refuses one
    with pytest.raises(blockir.BlockError, match="T takes no keyword argument 'attention_mask'"):
        m(x, attention_mask=None)


def test_an_interpreter_run_drops_the_context_like_non_strict_export() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0).eval()
    x = _x(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(fx.Interpreter(m).run(x), m(x), rtol=0, atol=0)


# ------------------------------------------------------------ one graph per distinct block


def test_the_layers_of_a_stack_share_one_graph_and_one_class() -> None:
    m = _compile(_stack(6), "M")
    classes = {type(layer) for layer in m.layers}
    graphs = {id(layer._graph) for layer in m.layers}
    assert len(classes) == 1 and len(graphs) == 1
    assert type(m.layers[0]).__name__ == "L"
    # the parameters are each layer's own
    assert m.layers[0].m.fc1.weight is not m.layers[1].m.fc1.weight


def test_code_is_generated_once_per_distinct_block(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real = generated.generate

    def counting(name: str, *args: object) -> object:
        made.append(name)
        return real(name, *args)

    monkeypatch.setattr(generated, "generate", counting)
    _compile(_stack(200), "M", device="meta")
    assert sorted(made) == ["L", "M"]
    made.clear()
    # in inference, layer 0 receives the caller's input and the others a donated buffer: two graphs
    _compile(_stack(50), "M", device="meta", mode="infer")
    assert sorted(made) == ["L", "L", "M"]


def test_layer_dependent_constants_get_a_graph_per_value() -> None:
    body = ("  const g = 1 / (layer + 1)\n  const a = (2 * num_layers) ** 0.25\n  p: linear(D, D)\n"
            "  y = a * x + g * p(x)")
    m = _compile(_stack(3, body), "M")
    assert len({type(layer) for layer in m.layers}) == 3
    x = _x(2, 3, 8)
    for i, layer in enumerate(m.layers):
        with torch.no_grad():
            want = 6 ** 0.25 * x + layer.p(x) / (i + 1)
            torch.testing.assert_close(layer(x), want)
    # constants that only depend on num_layers are the same in every layer: one graph
    shared = _compile(_stack(4, "  const a = (2 * num_layers) ** 0.25\n  p: linear(D, D)\n  y = a * x + p(x)"), "M")
    assert len({type(layer) for layer in shared.layers}) == 1


def test_dropout_layers_share_a_graph_and_read_their_index() -> None:
    m = _compile(_stack(3, "  m: mlp(F)\n  y = x + dropout(m(x), p=0.5)"), "M").train()
    assert len({type(layer) for layer in m.layers}) == 1
    assert "self.blockir_layer" in m.layers[0].code
    x = _x(2, 3, 8)
    torch.manual_seed(0)
    _, values = blockir.trace(m, x)
    dropped = [values[f"layers.{i}.%1"] == 0 for i in range(3)]
    assert not torch.equal(dropped[0], dropped[1]) and not torch.equal(dropped[1], dropped[2])


def test_editing_one_layers_graph_leaves_the_others_alone() -> None:
    m = _compile(_stack(3), "M")
    x = _x(2, 3, 8)
    with torch.no_grad():
        before = [layer(x) for layer in m.layers]
    layer = m.layers[1]
    g = layer.graph  # a private copy from now on
    assert g is not m.layers[0]._graph and g.owning_module is layer
    add = next(n for n in g.nodes if n.op == "call_function" and n.name == "y")
    with g.inserting_after(add):
        doubled = g.call_function(torch.mul, (add, 2.0))
    add.replace_all_uses_with(doubled, delete_user_cb=lambda n: n is not doubled)
    layer.recompile()
    assert type(layer) is not type(m.layers[0])
    with torch.no_grad():
        torch.testing.assert_close(m.layers[1](x), 2 * before[1])
        torch.testing.assert_close(m.layers[0](x), before[0])
        torch.testing.assert_close(m.layers[2](x), before[2])


# ------------------------------------------------------------ copies and tracing


def test_deepcopy_then_trace() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0).eval()
    c = copy.deepcopy(m)
    x, ctx = _x(2, 5, 64), _llama_ctx()
    y, values = blockir.trace(c, x, **ctx)
    y_ref, ref = blockir.trace(m, x, **ctx)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    assert values.keys() == ref.keys() and "layers.1.h" in values
    assert type(c.layers[0]) is type(c.layers[1])
    assert c.layers[0].self_attn.q_proj.weight is not m.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        c.layers[0].self_attn.q_proj.weight.zero_()
        assert not torch.equal(c(x), m(x))


def test_shallow_copy_shares_parameters() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0)
    c = copy.copy(m)
    assert c.layers is m.layers
    x = _x(2, 5, 64)
    torch.testing.assert_close(blockir.trace(c, x)[0], m(x))


def test_symbolic_trace_gives_the_forward_without_context() -> None:
    m = _compile(_stack(3, "  n: rmsnorm(D)\n  m: gated_mlp(F)\n  y = x + dropout(m(n(x)), p=0.1)"), "M").eval()
    traced = fx.symbolic_trace(m)
    x = _x(2, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), m(x), rtol=1e-6, atol=1e-6)
    # the norms and dropout are single calls; the input check survives as one
    targets = {n.target for n in traced.graph.nodes if n.op == "call_function"}
    assert {check_inputs, bfx.dropout_site, rms_norm} <= targets
    with pytest.raises(blockir.BlockError, match="axis D has size 4"):
        traced(_x(2, 3, 4))


def test_symbolic_trace_through_the_built_in_attention() -> None:
    # the attention takes its widths and head groups from the module, so tracing meets no shape test
    m = blockir.compile(LLAMA, "LlamaModel", seed=0).eval()
    traced = fx.symbolic_trace(m)
    x = _x(2, 5, 64)
    with torch.no_grad():
        torch.testing.assert_close(traced(x), m(x), rtol=0, atol=0)


@pytest.mark.xfail(strict=True, raises=NameError,
                   reason="a BoundExtern shares its module's tables instead of holding it: fx cannot name the module")
def test_symbolic_trace_through_a_bound_extern() -> None:
    text = ("block T(x: [B, S, D]) -> [B, S, D] {\n  f: extern(x: [B, S, D]) -> [B, S, D]\n  y = x + f(x)\n"
            "  return y\n}\n")
    fx.symbolic_trace(_compile(text, "T", bind={"f": nn.Linear(8, 8)}))


def test_symbolic_trace_of_sub_blocks_stacks_scales_and_every_branch_but_attention() -> None:
    text = ("block Inner(x: [B, S, D]) -> [B, S, D] {\n  n: layernorm(D)\n  m: mlp(F, act=gelu_tanh)\n"
            "  g: vector(D, init=0.5)\n  y = x + g * drop_path(m(n(x)), p=0.2)\n  return y\n}\n"
            "block L(x: [B, S, D]) -> [B, S, D] {\n  inner: Inner\n  n: rmsnorm(D)\n  m: gated_mlp(F)\n"
            "  r: scalar(init=0.3)\n  h = inner(x)\n  y = h + r * m(n(h))\n  return y\n}\n"
            "model M(x: [B, S, D]) -> [B, S, D] {\n  layers: L * 3\n  norm: rmsnorm(D)\n"
            "  return norm(layers(x))\n}\n")
    m = _compile(text, "M")
    x = _x(4, 3, 8)
    for mode in ("eval", "train"):
        getattr(m, mode)()
        traced = fx.symbolic_trace(m)
        torch.manual_seed(0)
        want = m(x)
        torch.manual_seed(0)
        torch.testing.assert_close(traced(x), want, rtol=1e-6, atol=1e-6)


def test_torch_compile_fullgraph_on_a_stack_with_dropout_and_context() -> None:
    m = blockir.compile(LLAMA, "LlamaModel", seed=0).train()
    x, ctx = _x(2, 5, 64), _llama_ctx()
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, **ctx), m(x, **ctx), rtol=1e-6, atol=1e-6)
