"""Misuse of the Python API is a BlockError with a location and a clear message, never a raw exception;
bound modules are checked, called as documented and never modified."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import Tensor, nn

import blockir
from blockir.lower import adapters as A
from blockir.ir.program import Program
from conftest import ROOT

LLAMA = ROOT / "examples" / "llama.block"
D = 16

STACK = blockir.parse(f"""dim B: batch
dim S: seq
dim D: model = {D}
dim F: hidden = 2 * D
block Layer(x: [B, S, D]) -> [B, S, D] {{
  attn: extern(x: [B, S, D]) -> [B, S, D]
  mlp: mlp(F)
  h = x + attn(x)
  y = h + mlp(h)
  return y
}}
model Model(x: [B, S, D]) -> [B, S, D] {{
  layers: Layer * 2
  return layers(x)
}}
""", "stack.block")


def _x(seed: int = 0) -> Tensor:
    return torch.randn(2, 3, D, generator=torch.Generator().manual_seed(seed))


def _llama(**kw: Any) -> Callable[[], object]:
    return lambda: blockir.compile(LLAMA, "LlamaDecoderLayer", **kw)


def _stack(bind: Any, **kw: Any) -> Callable[[], object]:
    return lambda: blockir.compile(STACK, "Model", bind=bind, **kw)


def _both(attn: Any = None) -> dict[str, Any]:
    return {"layers.0.attn": attn or nn.Linear(D, D), "layers.1.attn": attn or nn.Linear(D, D)}


NO_EXTERN = "'LlamaDecoderLayer' declares no extern; only extern declarations can be bound"
BINDABLE = "bindable externs of 'Model': layers.0.attn, layers.1.attn"

# (call, code, message, where: "FILE:LINE:COL" or the argument)
CASES: dict[str, tuple[Callable[[], object], str, str, str]] = {
    "compile mode": (_llama(mode="fast"), "E0722", "mode must be 'train' or 'infer', got 'fast'",
                     "blockir.compile(mode=…)"),
    "compile backend": (_llama(backend="jit"), "E0722", "unknown backend 'jit'; expected one of 'fx', 'fused'",
                        "blockir.compile(backend=…)"),
    "compile dtype int": (_llama(dtype=torch.int32), "E0722", "dtype must be a floating torch.dtype, got torch.int32",
                          "blockir.compile(dtype=…)"),
    "compile dtype str": (_llama(dtype="bf16"), "E0722", "dtype must be a floating torch.dtype, got 'bf16'",
                          "blockir.compile(dtype=…)"),
    "compile device type": (_llama(device=0.5), "E0722", "device must be a str or torch.device, got float",
                            "blockir.compile(device=…)"),
    "compile device name": (_llama(device="gpu0"), "E0722", "cannot allocate on device 'gpu0'",
                            "blockir.compile(device=…)"),
    "compile seed str": (_llama(seed="0"), "E0722", "seed must be an int in [-2**63, 2**64), got '0'",
                         "blockir.compile(seed=…)"),
    "compile seed bool": (_llama(seed=True), "E0722", "seed must be an int in [-2**63, 2**64), got True",
                          "blockir.compile(seed=…)"),
    "compile seed huge": (_llama(seed=2 ** 64), "E0722", f"seed must be an int in [-2**63, 2**64), got {2 ** 64}",
                          "blockir.compile(seed=…)"),
    "compile name": (lambda: blockir.compile(LLAMA, 3), "E0722", "the block name must be a str, got int",
                     "blockir.compile(name=…)"),
    "compile program": (lambda: blockir.compile(123, "X"), "E0722", "expected a Program or a path, got int",
                        "blockir.compile(program=…)"),
    "compile unknown block": (lambda: blockir.compile(LLAMA, "Nope"), "E0700",
                              "no block named 'Nope' (blocks: LlamaDecoderLayer, LlamaModel)", f"{LLAMA}:1:1"),
    "bind not a mapping": (_llama(bind=[("self_attn", nn.Identity())]), "E0722",
                           "bind must be a mapping of extern paths to modules, got list", "blockir.compile(bind=…)"),
    "bind a built-in": (_llama(bind={"self_attn": nn.Identity()}), "E0720",
                        "bind key 'self_attn' names the built-in self_attention 'self_attn', not an extern",
                        f"{LLAMA}:26:3"),
    "bind an unknown name": (_stack({**_both(), "attn": nn.Identity()}), "E0720",
                             "bind key 'attn' names no extern of 'Model'", "stack.block:12:7"),
    "bind a key that is not a str": (_stack({**_both(), 1: nn.Identity()}), "E0720",
                                     "bind key '1' names no extern of 'Model'", "stack.block:12:7"),
    "bind past the stack": (_stack({**_both(), "layers.2.attn": nn.Identity()}), "E0720",
                            "bind key 'layers.2.attn' names no layer of the stack 'layers', which has 2 (0–1)",
                            "stack.block:13:3"),
    "bind a stack layer": (_stack({**_both(), "layers.0": nn.Identity()}), "E0720",
                           "bind key 'layers.0' names a layer of the stack 'layers', not an extern",
                           "stack.block:13:3"),
    "bind a built-in in a stack": (_stack({**_both(), "layers.1.mlp": nn.Identity()}), "E0720",
                                   "bind key 'layers.1.mlp' names the built-in mlp 'mlp', not an extern",
                                   "stack.block:7:3"),
    "bind one layer of two": (_stack({"layers.0.attn": nn.Identity()}), "E0704",
                              "extern 'attn' is not bound at layers.1.attn", "stack.block:6:3"),
    "bind a non-callable adapter": (_stack({**_both(), "layers.1.attn": (nn.Identity(), "identity")}), "E0704",
                                    "the adapter bound to extern 'layers.1.attn' is not callable (str)",
                                    "stack.block:6:3"),
    "bind a triple": (_stack({**_both(), "layers.1.attn": (nn.Identity(), A.call_module, {})}), "E0704",
                      "extern 'layers.1.attn' is bound to a tuple of 3 items", "stack.block:6:3"),
    "bind a function": (_stack({**_both(), "layers.0.attn": torch.tanh}), "E0704",
                        "extern 'layers.0.attn' must be bound to an nn.Module, got builtin_function_or_method",
                        "stack.block:6:3"),
    "reconcile unknown block": (lambda: blockir.reconcile(STACK, "Nope", {}), "E0700",
                                "no block named 'Nope' (blocks: Layer, Model)", "stack.block:1:1"),
    "reconcile not a mapping": (lambda: blockir.reconcile(STACK, "Model", ["layers.0.mlp.fc1.weight"]), "E0722",
                                "expected a mapping of keys to tensors or shapes, got list",
                                "blockir.reconcile(state_dict_or_shapes=…)"),
    "reconcile not a shape": (lambda: blockir.reconcile(STACK, "Model", {"layers.0.mlp.fc1.weight": "32x16"}),
                              "E0722", "key 'layers.0.mlp.fc1.weight' maps to str '32x16', neither a tensor nor a shape",
                              "blockir.reconcile(state_dict_or_shapes=…)"),
    "reconcile not a program": (lambda: blockir.reconcile("stack.block", "Model", {}), "E0722",
                                "reconcile expects a Program, got str", "blockir.reconcile(program=…)"),
    "reconcile unknown dim": (lambda: blockir.reconcile(STACK, "Model", {}, dims={"Q": 2}), "E0702",
                              "unknown dim(s) in dims=: Q", f"{STACK.filename}:1:1"),
    "verify a str": (lambda: blockir.verify("dim D: model = 4"), "E0722", "verify expects a Program, got str",
                     "blockir.verify(program=…)"),
    "parse bytes": (lambda: blockir.parse(b"dim D: model = 4"), "E0722",
                    "parse expects the program text as a str, got bytes", "blockir.parse(text=…)"),
    "load an int": (lambda: blockir.load(3), "E0722", "expected a file path (str or os.PathLike), got int",
                    "blockir.load(path=…)"),
    "trace a plain module": (lambda: blockir.trace(nn.Linear(D, D), _x()), "E0722",
                             "trace expects a module returned by blockir.compile, got Linear",
                             "blockir.trace(module=…)"),
    "adapter for an unknown class": (lambda: A.adapter_for(nn.ReLU()), "E0722",
                                     f"no adapter for ReLU; known: {', '.join(sorted(A.ADAPTERS))}",
                                     "blockir.lower.adapters.adapter_for(module=…)"),
}
if not torch.cuda.is_available():
    CASES["compile device missing"] = (_llama(device="cuda"), "E0722",
                                       "cannot allocate on device 'cuda'", "blockir.compile(device=…)")


@pytest.mark.parametrize("case", list(CASES))
def test_misuse_is_a_located_block_error(case: str) -> None:
    call, code, message, where = CASES[case]
    with pytest.raises(blockir.BlockError) as info:
        call()
    d = info.value.diagnostics[0]
    assert (d.code, d.message, str(d.span)) == (code, message, where)


def test_an_argument_error_renders_without_a_source_line() -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.compile(LLAMA, "LlamaDecoderLayer", mode="fast")
    assert str(info.value) == "blockir.compile(mode=…): error[E0722]: mode must be 'train' or 'infer', got 'fast'"


def test_binding_a_built_in_lists_what_can_be_bound() -> None:
    with pytest.raises(blockir.BlockError) as info:
        _llama(bind={"self_attn": nn.Identity()})()
    assert info.value.diagnostics[0].hint == (f"{NO_EXTERN}; binding does not replace a built-in: declare it "
                                               "`extern(...)` to bind a module there")
    with pytest.raises(blockir.BlockError) as info:
        _stack({**_both(), "attn": nn.Identity()})()
    assert info.value.diagnostics[0].hint == BINDABLE


def test_every_unbound_path_is_reported_once_per_declaration() -> None:
    with pytest.raises(blockir.BlockError) as info:
        _stack({})()
    (d,) = info.value.diagnostics
    assert d.message == "extern 'attn' is not bound at layers.0.attn, layers.1.attn"
    assert d.hint == "pass bind={'layers.0.attn': module, …}: one entry per path"


# ------------------------------------------------------------ bound modules


def _one() -> Program:
    return blockir.parse(f"""dim B: batch
dim S: seq
dim D: model = {D}
block E(x: [B, S, D]) -> [B, S, D] {{
  f: extern(x: [B, S, D]) -> [B, S, D]
  y = x + f(x)
  return y
}}
""", "one.block")


def test_a_dtype_conversion_copies_the_bound_module() -> None:
    lin = nn.Linear(D, D)
    before = lin.weight.detach().clone()
    m = blockir.compile(_one(), "E", bind={"f": lin}, dtype=torch.bfloat16)
    assert lin.weight.dtype == torch.float32 and torch.equal(lin.weight, before)
    assert m.get_parameter("f.weight").dtype == torch.bfloat16
    x = _x().to(torch.bfloat16)
    torch.testing.assert_close(m(x), x + nn.functional.linear(x, before.to(torch.bfloat16),
                                                              lin.bias.to(torch.bfloat16)))


def test_without_conversion_the_parameters_are_shared() -> None:
    lin = nn.Linear(D, D)
    m = blockir.compile(_one(), "E", bind={"f": lin}, dtype=torch.float32)
    assert m.get_parameter("f.weight") is lin.weight
    assert set(m.state_dict()) == {"f.weight", "f.bias"}
    m.eval()
    assert not lin.training  # train/eval mode is shared with the parameters


def test_two_programs_binding_one_module_keep_their_own_adapters() -> None:
    lin = nn.Linear(D, D)
    plain = blockir.compile(_one(), "E", bind={"f": lin})
    doubled = blockir.compile(_one(), "E", bind={"f": (lin, lambda module, x, **ctx: 2 * module(x))})
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(plain(x), x + lin(x))
        torch.testing.assert_close(doubled(x), x + 2 * lin(x))
    assert vars(lin).keys() == vars(nn.Linear(D, D)).keys()  # nothing was written onto the caller's module


def test_a_wrong_result_shape_is_e0721_at_the_extern() -> None:
    m = blockir.compile(_one(), "E", bind={"f": nn.Linear(D, D // 2)})
    with pytest.raises(blockir.BlockError) as info:
        m(_x())
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span)) == ("E0721", "one.block:5:3")
    assert d.message == "extern 'f' returned shape [2, 3, 8], expected [B, S, D] = [2, 3, 16]"


def test_a_tuple_result_is_e0721_with_the_adapter_hint() -> None:
    m = blockir.compile(_one(), "E", bind={"f": nn.GRU(D, D, batch_first=True)})
    with pytest.raises(blockir.BlockError) as info:
        m(_x())
    (d,) = info.value.diagnostics
    assert d.message == "extern 'f' returned a tuple, expected a tensor [B, S, D]"
    assert "blockir.lower.adapters" in d.hint


class Scaled(nn.Module):
    """Reads one ctx keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x: Tensor, *, scale: float = 1.0) -> Tensor:
        return scale * self.lin(x)


class Recorder(nn.Module):
    """Takes every keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, object] = {}

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        self.seen = dict(ctx)
        return x


def test_a_plain_binding_is_called_with_the_ctx_its_forward_takes() -> None:
    scaled = Scaled()
    m = blockir.compile(_one(), "E", bind={"f": scaled})
    x = _x()
    with torch.no_grad():
        torch.testing.assert_close(m(x, scale=3.0), x + 3.0 * scaled.lin(x))
    # `attention_mask`, which nothing in the module reads, is refused rather than dropped
    with pytest.raises(blockir.BlockError) as info:
        m(x, scale=3.0, attention_mask=None)
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span), d.message, d.hint) == (
        "E0710", "one.block:4:7", "E takes no keyword argument 'attention_mask': nothing in it reads it",
        "E reads: scale")
    # a forward that takes **kwargs reads any keyword, and gets every one
    recorder = Recorder()
    blockir.compile(_one(), "E", bind={"f": recorder})(x, scale=3.0, attention_mask=None)
    assert recorder.seen == {"scale": 3.0, "attention_mask": None}


def test_a_bound_module_under_torch_compile() -> None:
    lin = nn.Linear(D, D)
    m = blockir.compile(_one(), "E", bind={"f": lin})
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = _x()
    torch.testing.assert_close(compiled(x), m(x))
