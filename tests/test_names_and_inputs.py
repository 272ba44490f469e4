"""Names that collide with nn.Module / fx / Python, built-in functions in every form, and input checks."""
from __future__ import annotations

import inspect

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from conftest import ROOT
from torch import Tensor, nn

import blockir
from blockir.analyses.sizes import Sizes
from blockir.lower import fx as bfx
from blockir.lower.boundary import check_inputs
from blockir.ir.identifiers import BLOCK_ATTRIBUTES, MODULE_ATTRIBUTES
from blockir.ir.kinds import ACTIVATIONS, FUNCTIONS

HEADER = "dim B: batch\ndim S: seq\ndim D: model = 8\ndim F: hidden = 16\n"
LLAMA = ROOT / "examples" / "llama.block"

# every name the report listed, and a few more that the generated code itself uses
NAMES = ["forward", "training", "to", "cuda", "state_dict", "register_buffer", "code", "graph", "_modules",
         "__class__", "self", "import", "class", "None", "a.forward", "meta", "blockir_values", "ctx", "torch",
         "context", "getattr", "layers", "a.self", "a.code"]


def _x(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _program(body: str, params: str = "x: [B, S, D]") -> str:
    return HEADER + f"block T({params}) -> [B, S, D] {{\n{body}\n}}\n"


def _check(text: str) -> list[blockir.Diagnostic]:
    try:
        program = blockir.parse(text, "t.block")
    except blockir.BlockError as exc:
        return [d for d in exc.diagnostics if d.is_error]
    return [d for d in blockir.verify(program) if d.is_error]


def _runs(m: nn.Module, *inputs: Tensor) -> Tensor:
    """Forward, trace and symbolic trace agree."""
    y = m(*inputs)
    y_traced, _ = blockir.trace(m, *inputs)
    torch.testing.assert_close(y_traced, y, rtol=0, atol=0)
    torch.testing.assert_close(fx.symbolic_trace(m)(*inputs), y, rtol=1e-6, atol=1e-6)
    return y


# ------------------------------------------------------------ names


@pytest.mark.parametrize("name", NAMES)
def test_a_declaration_name_compiles_at_its_key_or_is_reserved_in_check(name: str) -> None:
    text = _program(f"  {name}: rmsnorm(D)\n  y = x + {name}(x)\n  return y")
    errors = _check(text)
    if errors:
        (d,) = errors
        assert d.code == "E0102" and d.message.startswith(f"declaration '{name}' ")
        assert (d.span.filename, d.span.line, d.span.column) == ("t.block", 6, 3)
        assert d.hint and "rename it" in d.hint
        return
    m = blockir.compile(blockir.parse(text, "t.block"), "T", seed=0)
    assert list(m.state_dict()) == [f"{name}.weight"]
    assert m.get_parameter(f"{name}.weight").shape == (8,)
    x = _x(2, 3, 8)
    with torch.no_grad():
        m.get_parameter(f"{name}.weight").mul_(3.0)
    want = x + 3.0 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(_runs(m, x), want)


def test_which_names_are_reserved() -> None:
    reserved = {n for n in NAMES if _check(_program(f"  {n}: rmsnorm(D)\n  y = x + {n}(x)\n  return y"))}
    assert reserved == {"forward", "training", "to", "cuda", "state_dict", "register_buffer", "code", "graph",
                        "_modules", "__class__", "import", "class", "None", "a.forward", "meta", "blockir_values"}
    # a later part only collides with nn.Module: fx's attributes are free there (BERT has attention.self)
    assert "a.code" not in reserved and "a.self" not in reserved


def test_reserved_names_of_stacks_externs_and_scales() -> None:
    for decl in ("forward: scalar(init=1)", "to: extern(x: [B, S, D]) -> [B, S, D]", "state_dict: L * 2"):
        name = decl.split(":")[0]
        text = HEADER + ("block L(x: [B, S, D]) -> [B, S, D] {\n  n: rmsnorm(D)\n  y = x + n(x)\n  return y\n}\n"
                         f"block T(x: [B, S, D]) -> [B, S, D] {{\n  {decl}\n  n: rmsnorm(D)\n  y = x + n(x)\n"
                         "  return y\n}\n")
        (d,) = _check(text)
        assert d.code == "E0102" and f"declaration '{name}' is an attribute of torch.nn.Module" in d.message


def test_the_reserved_lists_cover_the_installed_torch() -> None:
    def public(names: set[str]) -> set[str]:
        # dunders are reserved as a class; torch.compile marks nn.Module with ___-prefixed flags at run time
        return {n for n in names if not (n.startswith("__") and n.endswith("__")) and not n.startswith("___")}

    def torchs(cls: type, names: set[str]) -> set[str]:
        """Leave out what other libraries add to the class at run time (transformers: smart_apply)."""
        out = set()
        for n in names:
            attr = inspect.getattr_static(cls, n, None)
            where = getattr(attr, "__module__", None) or getattr(getattr(attr, "fget", None), "__module__", None)
            if where is None or where.startswith(("torch", "blockir")):
                out.add(n)
        return out

    assert torchs(nn.Module, public(set(dir(nn.Module())))) <= MODULE_ATTRIBUTES
    m = blockir.compile(LLAMA, "LlamaDecoderLayer")
    own = {n for n, _ in m.named_children()} | {n for n, _ in m.named_parameters(recurse=False)}
    assert torchs(type(m), public(set(dir(m))) - own) <= BLOCK_ATTRIBUTES


def test_an_attribute_another_library_adds_is_a_located_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nn.Module, "smart_apply", lambda self: None, raising=False)
    text = _program("  smart_apply: rmsnorm(D)\n  y = x + smart_apply(x)\n  return y")
    with pytest.raises(blockir.BlockError) as info:
        blockir.compile(blockir.parse(text, "t.block"), "T")
    (d,) = info.value.diagnostics
    assert d.code == "E0709" and (d.span.line, d.span.column) == (6, 3)
    assert d.message == "declaration 'smart_apply' cannot be registered: attribute 'smart_apply' already exists"


@pytest.mark.parametrize("name", [n for n in NAMES if "." not in n])
def test_a_value_of_any_name_compiles_and_traces_by_its_name(name: str) -> None:
    text = _program(f"  n: rmsnorm(D)\n  {name} = n(x)\n  y = x + {name}\n  return y")
    m = blockir.compile(blockir.parse(text, "t.block"), "T", seed=0)
    x = _x(2, 3, 8)
    y = _runs(m, x)
    _, values = blockir.trace(m, x)
    torch.testing.assert_close(values[name], y - x)


@pytest.mark.parametrize("name", [n for n in NAMES if "." not in n])
def test_an_input_of_any_name_compiles(name: str) -> None:
    text = _program(f"  n: rmsnorm(D)\n  y = {name} + n({name})\n  return y", f"{name}: [B, S, D]")
    m = blockir.compile(blockir.parse(text, "t.block"), "T", seed=0)
    x = _x(2, 3, 8)
    y = _runs(m, x)
    _, values = blockir.trace(m, x)
    assert torch.equal(values[name], x) and torch.equal(values["y"], y)


def test_inputs_named_like_generated_code_globals_keep_their_positions() -> None:
    text = HEADER + ("block T(torch: [B, S, D], self: [B, S, D], ctx: [B, S, D]) -> [B, S, D] {\n"
                     "  n: rmsnorm(D)\n  y = torch + n(self) + cast(ctx, f32)\n  return y\n}\n")
    m = blockir.compile(blockir.parse(text, "t.block"), "T", seed=0)
    a, b, c = _x(2, 3, 8), _x(2, 3, 8, seed=1), _x(2, 3, 8, seed=2)
    torch.testing.assert_close(_runs(m, a, b, c), a + m.n(b) + c)
    assert "def forward(self, torch_ = Missing.INPUT, self_ = Missing.INPUT, ctx_ = Missing.INPUT, *extra, **ctx)" \
        in m.code


# ------------------------------------------------------------ built-in functions in every form

def _act2fn(name: str):
    """transformers' own function, for the activations the language takes from its ACT2FN table."""
    from transformers.activations import ACT2FN
    return ACT2FN[name]


TORCH_ACTIVATIONS = {
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
    "tanh": torch.tanh, "identity": lambda t: t, "relu6": F.relu6, "leaky_relu": F.leaky_relu,
    "hardswish": F.hardswish, "mish": F.mish, "swish": F.silu,
    "gelu_bloom": lambda t: t * 0.5 * (1.0 + torch.tanh(0.79788456 * t * (1 + 0.044715 * t * t))),
}
for _name in ACTIVATIONS:
    TORCH_ACTIVATIONS.setdefault(_name, lambda t, n=_name: _act2fn(n)(t))
TORCH_GATES = {"sigmoid": torch.sigmoid, "erf": torch.erf}


def test_every_activation_has_a_torch_reference() -> None:
    assert set(TORCH_ACTIVATIONS) == set(ACTIVATIONS)
    assert all(callable(_act2fn(n)) for n in ACTIVATIONS if n not in ("relu", "gelu", "gelu_tanh", "silu", "tanh",
                                                                      "identity", "hardswish", "gelu_bloom"))
    others = {"dropout", "drop_path", "layer_drop", "cast", "concat", "zeros"}
    assert set(FUNCTIONS) == set(ACTIVATIONS) | set(TORCH_GATES) | others


def _activation_cases() -> list[tuple[str, str]]:
    return [(fn, form) for fn in ACTIVATIONS for form in ("function", "declaration", "mlp", "gated_mlp")]


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("fn, form", _activation_cases(), ids=[f"{f}-{g}" for f, g in _activation_cases()])
def test_every_activation_in_every_form_is_torchs(fn: str, form: str, backend: str) -> None:
    body = {
        "function": f"  p: linear(D, D)\n  n: rmsnorm(D)\n  h = x + p({fn}(x))\n  y = n(h)",
        "declaration": f"  p: linear(D, D)\n  a: activation({fn})\n  n: rmsnorm(D)\n  h = x + p(a(x))\n  y = n(h)",
        "mlp": f"  m: mlp(F, act={fn})\n  y = x + m(x)",
        "gated_mlp": f"  m: gated_mlp(F, act={fn})\n  y = x + m(x)",
    }[form]
    m = blockir.compile(blockir.parse(_program(body + "\n  return y"), "t.block"), "T", seed=0, backend=backend)
    act = TORCH_ACTIVATIONS[fn]
    x = _x(2, 3, 8) * 2
    with torch.no_grad():
        if form in ("function", "declaration"):
            h = x + m.p(act(x))
            want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * m.n.weight
        elif form == "mlp":
            want = x + m.m.fc2(act(m.m.fc1(x)))
        else:
            want = x + m.m.down_proj(act(m.m.gate_proj(x)) * m.m.up_proj(x))
        torch.testing.assert_close(_runs(m, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("fn", sorted(TORCH_GATES))
def test_every_gate_function_is_torchs(fn: str, backend: str) -> None:
    body = f"  p: linear(D, D)\n  q: linear(D, D)\n  n: rmsnorm(D)\n  h = x + p(x) * {fn}(q(x))\n  y = n(h)"
    m = blockir.compile(blockir.parse(_program(body + "\n  return y"), "t.block"), "T", seed=0, backend=backend)
    x = _x(2, 3, 8)
    with torch.no_grad():
        h = x + m.p(x) * TORCH_GATES[fn](m.q(x))
        want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * m.n.weight
        torch.testing.assert_close(_runs(m, x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_dropout_drop_path_and_cast_are_torchs(backend: str) -> None:
    # each op reads an input of its own, so that no residual add counts the state twice
    body = ("  n: rmsnorm(D)\n  a = dropout(u, p=0.25)\n  b = drop_path(v, p=0.5)\n  c = cast(w, bf16)\n"
            "  h = x + a\n  g = h + b\n  y = n(g + cast(c, f32))")
    params = "x: [B, S, D], u: [B, S, D], v: [B, S, D], w: [B, S, D]"
    m = blockir.compile(blockir.parse(_program(body + "\n  return y", params), "t.block"), "T", seed=0,
                        backend=backend)
    x = _x(4, 3, 8)
    with torch.no_grad():
        g = 3 * x + x.to(torch.bfloat16).to(torch.float32)
        want = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-6) * m.n.weight
        torch.testing.assert_close(_runs(m.eval(), x, x, x, x), want)
        torch.manual_seed(0)
        _, values = blockir.trace(m.train(), x, x, x, x)
    kept = values["a"] != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(values["a"][kept], x[kept] / 0.75)  # inverted dropout, per element
    for row, src in zip(values["b"].flatten(1), x.flatten(1)):  # drop_path keeps or drops whole samples
        assert torch.equal(row, torch.zeros_like(row)) or torch.allclose(row, src / 0.5)
    assert values["c"].dtype == torch.bfloat16 and torch.equal(values["c"], x.to(torch.bfloat16))


def test_concat_is_torch_cat() -> None:
    # a concatenation widens the last axis to D+D, which no declaration accepts, so no program that
    # verifies uses one; the lowering still compiles it as torch.cat
    text = HEADER + "block T(x: [B, S, D]) -> [B, S, D] {\n  y = concat(x, dropout(x, p=0.0))\n  return y\n}\n"
    program = blockir.parse(text, "t.block")
    m = bfx.lower_block(program, program.block("T"), Sizes.of(program), {})
    x = _x(2, 3, 8)
    torch.testing.assert_close(_runs(m, x), torch.cat((x, x), dim=-1), rtol=0, atol=0)


# ------------------------------------------------------------ input checks

CROSS = HEADER + """dim T: seq
dim H: heads = 2
block X(x: [B, T, D], memory: [B, S, D]) -> [B, T, D] {
  a: cross_attention(heads=H)
  y = x + a(x, memory)
  return y
}
"""


def _error(m: nn.Module, *inputs: object) -> blockir.Diagnostic:
    with pytest.raises(blockir.BlockError) as info:
        m(*inputs)
    (d,) = info.value.diagnostics
    assert d.code == "E0708"
    return d


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return blockir.compile(LLAMA, "LlamaModel", seed=0)


@pytest.mark.parametrize("bad, message", [
    (_x(5, 64), "input 'x' of LlamaModel has 2 axes [5, 64], expected 3: [B, S, D]"),
    (_x(1, 2, 5, 64), "input 'x' of LlamaModel has 4 axes [1, 2, 5, 64], expected 3: [B, S, D]"),
    (None, "input 'x' of LlamaModel must be a tensor [B, S, D], got NoneType"),
    ([[0.0] * 64], "input 'x' of LlamaModel must be a tensor [B, S, D], got list"),
    (torch.zeros(2, 5, 64, dtype=torch.int64),
     "input 'x' of LlamaModel must be a floating-point tensor, got torch.int64"),
    (_x(2, 5, 32), "input 'x' of LlamaModel: axis D has size 32, but the module was compiled with D = 64"),
])
def test_bad_inputs_name_the_input_and_the_axis(llama: nn.Module, bad: object, message: str) -> None:
    d = _error(llama, bad)
    assert d.message == message
    assert (d.span.line, d.span.column) == (34, 18)  # the parameter in `model LlamaModel(x: [B, S, D])`
    assert str(d.span.filename).endswith("llama.block")


def test_a_size_given_at_compile_time_is_checked(llama: nn.Module) -> None:
    m = blockir.compile(LLAMA, "LlamaDecoderLayer", dims={"D": 32})
    m(_x(2, 5, 32))
    d = _error(m, _x(2, 5, 64))
    assert d.message == "input 'x' of LlamaDecoderLayer: axis D has size 64, but the module was compiled with D = 32"
    assert d.hint == "compile with dims={'D': 64} for this size"
    # open dims take any size, and batch and sequence sizes stay free even when dims= gives them
    llama(_x(3, 7, 64))
    pinned = blockir.compile(LLAMA, "LlamaDecoderLayer", dims={"B": 2, "S": 5})
    assert pinned(_x(4, 9, 64)).shape == (4, 9, 64)


def test_one_size_per_axis_name_across_inputs() -> None:
    m = blockir.compile(blockir.parse(CROSS, "x.block"), "X", seed=0)
    m(_x(2, 3, 8), _x(2, 5, 8))  # T and S differ: fine
    d = _error(m, _x(2, 3, 8), _x(4, 5, 8))
    assert d.message == "input 'memory' of X: axis B has size 4, but input 'x' has B = 2"
    assert (d.span.line, d.span.column) == (7, 23)


def test_a_declared_dtype_is_checked() -> None:
    text = HEADER + "block T(x: [B, S, D] bf16) -> [B, S, D] bf16 {\n  n: rmsnorm(D)\n  y = x + n(x)\n  return y\n}\n"
    m = blockir.compile(blockir.parse(text, "t.block"), "T", seed=0)
    m(_x(2, 3, 8).bfloat16())
    d = _error(m, _x(2, 3, 8))
    assert d.message == "input 'x' of T is declared bf16, got torch.float32"


def test_only_the_compiled_root_checks(llama: nn.Module) -> None:
    assert "check_inputs" in llama.code
    assert "check_inputs" not in llama.layers[0].code


def test_the_check_is_traced_away_by_torch_compile_and_export(llama: nn.Module) -> None:
    m = llama.eval()
    x = _x(2, 5, 64)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))
    # a failing check cannot be one graph: fullgraph refuses it, a plain compile falls back to raising
    with pytest.raises((torch._dynamo.exc.Unsupported, blockir.BlockError)):
        compiled(_x(2, 5, 32))
    with pytest.raises(blockir.BlockError, match="axis D has size 32"):
        torch.compile(m, backend="eager")(_x(2, 5, 32))
    exported = torch.export.export(m, (x,), strict=False).module()
    assert not any(n.target is check_inputs for n in exported.graph.nodes)
    torch.testing.assert_close(exported(x), m(x))


def test_token_ids_read_by_an_embedding_are_integers() -> None:
    text = HEADER + ("dim V: vocab = 11\n"
                     "block Inner(ids: [B, S]) -> [B, S, D] {\n  embed: embedding(V, D)\n  n: rmsnorm(D)\n"
                     "  x = embed(ids)\n  y = n(x)\n  return y\n}\n"
                     "model M(input_ids: [B, S]) -> [B, S, D] {\n  inner: Inner\n  return inner(input_ids)\n}\n")
    m = blockir.compile(blockir.parse(text, "t.block"), "M", seed=0)
    ids = torch.randint(0, 11, (2, 3))
    assert m(ids).shape == (2, 3, 8)
    d = _error(m, ids.float())
    assert d.message == "input 'input_ids' of M holds token ids and must be an integer tensor, got torch.float32"
