"""The compiled module's call boundary refuses what it cannot honour: keywords nothing in it reads, a wrong
number of inputs, inputs in another dtype or on another device, token ids outside the vocabulary, and a
bound extern whose result has the right shape but another dtype or device."""
from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import blockir
from blockir.lower import adapters as A
from conftest import ROOT

HEADER = "dim B: batch\ndim S: seq\ndim T: seq\ndim D: model = 8\ndim F: hidden = 16\ndim H: heads = 2\n"


def _x(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _compile(body: str, backend: str = "fx", params: str = "x: [B, S, D]", **kw: Any) -> nn.Module:
    args = ", ".join(re.findall(r"(\w+):", params))
    text = HEADER + f"block L({params}) -> [B, S, D] {{\n{body}\n}}\n" \
        f"model M({params}) -> [B, S, D] {{\n  layers: L * 2\n  norm: rmsnorm(D)\n  return norm(layers({args}))\n}}\n"
    return blockir.compile(blockir.parse(text, "t.block"), "M", backend, seed=0, **kw)


def _refused(m: nn.Module, *inputs: object, **ctx: object) -> blockir.Diagnostic:
    with pytest.raises(blockir.BlockError) as info:
        m(*inputs, **ctx)
    (d,) = info.value.diagnostics
    return d


ATTENTION = "  n: rmsnorm(D)\n  a: self_attention(heads=H{rope})\n  y = x + a(n(x))\n  return y"
MLP = "  n: rmsnorm(D)\n  f: mlp(F)\n  y = x + f(n(x))\n  return y"
BATCHNORM = "  n: batchnorm(D, padding=mask)\n  f: mlp(F)\n  y = x + f(n(x))\n  return y"
CROSS = "  n: rmsnorm(D)\n  c: cross_attention(heads=H)\n  y = x + c(n(x), memory)\n  return y"

# (body, params, the keywords the compiled model reads)
READS = {
    "attention": (ATTENTION.format(rope=""), "x: [B, S, D]",
                  ("attention_mask", "past_key_values", "src_key_padding_mask")),
    "rotary attention": (ATTENTION.format(rope=", rope=true"), "x: [B, S, D]",
                         ("attention_mask", "past_key_values", "position_embeddings", "position_ids",
                          "src_key_padding_mask")),
    "mlp": (MLP, "x: [B, S, D]", ()),
    "batchnorm": (BATCHNORM, "x: [B, S, D]", ("attention_mask",)),
    "cross attention": (CROSS, "x: [B, S, D], memory: [B, T, D]", ("memory_key_padding_mask", "memory_mask")),
}


@pytest.mark.parametrize("backend", ["fx", "fused"])
@pytest.mark.parametrize("case", list(READS))
def test_a_compiled_module_accepts_exactly_the_keywords_its_branches_read(case: str, backend: str) -> None:
    body, params, reads = READS[case]
    m = _compile(body, backend, params)
    assert m.blockir_contract.keywords == reads
    inputs = (_x(2, 3, 8),) if "memory" not in params else (_x(2, 3, 8), _x(2, 5, 8))
    m(*inputs, **{k: None for k in reads})  # every keyword read is accepted (None: nothing to apply)
    for wrong in sorted({"use_cache", "past_key_values", "atention_mask"} - set(reads)):
        d = _refused(m, *inputs, **{wrong: None})
        assert (d.code, d.message) == ("E0710", f"M takes no keyword argument '{wrong}': nothing in it reads it")


def test_a_misspelt_keyword_names_the_module_and_what_it_reads() -> None:
    m = _compile(ATTENTION.format(rope=", rope=true"))
    mask = torch.ones(2, 3, dtype=torch.long)
    d = _refused(m, _x(2, 3, 8), atention_mask=mask)
    assert (d.code, str(d.span)) == ("E0710", "t.block:13:7")
    assert d.message == "M takes no keyword argument 'atention_mask': nothing in it reads it"
    assert d.hint == ("did you mean 'attention_mask'? M reads: attention_mask, past_key_values, position_embeddings, "
                      "position_ids, src_key_padding_mask")
    d = _refused(_compile(MLP), _x(2, 3, 8), attention_mask=mask)
    assert d.hint == "M reads no keyword arguments: nothing in it takes a mask or position table"


EXTERN = "  n: rmsnorm(D)\n  f: extern(x: [B, S, D]) -> [B, S, D]\n  y = x + f(n(x))\n  return y"


def _bound(value: Any) -> nn.Module:
    return _compile(EXTERN, bind={"layers.0.f": value, "layers.1.f": value})


def test_a_bound_extern_reads_what_its_adapter_signature_names() -> None:
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    m = _bound((mha, A.multihead_attention))
    assert m.blockir_contract.keywords == ("is_causal", "src_key_padding_mask", "src_mask")
    x = _x(2, 3, 8)
    m(x, src_key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    assert _refused(m, x, attention_mask=None).code == "E0710"
    # an adapter (or a plain module) that takes **ctx may pass anything on: the module accepts any keyword
    m = _bound((nn.Linear(8, 8), lambda module, x, **ctx: module(x)))
    assert m.blockir_contract.keywords is None
    m(x, anything=1)


def test_each_extern_gets_only_the_keywords_it_reads() -> None:
    seen: list[set[str]] = []

    def adapter(module: nn.Module, x: Tensor, *, scale: float = 1.0) -> Tensor:
        seen.append({"scale"})
        return scale * module(x)
    text = ATTENTION.format(rope="").replace("  return y", "  f: extern(x: [B, S, D]) -> [B, S, D]\n"
                                                            "  z = y + f(y)\n  return z")
    lin = nn.Linear(8, 8)
    m = _compile(text, bind={"layers.0.f": (lin, adapter), "layers.1.f": (lin, adapter)})
    assert m.blockir_contract.keywords == ("attention_mask", "past_key_values", "scale", "src_key_padding_mask")
    m(_x(2, 3, 8), scale=2.0, attention_mask=torch.ones(2, 3, dtype=torch.long))  # the adapter takes no mask
    assert seen == [{"scale"}, {"scale"}]


# ------------------------------------------------------------ a bound extern's result


class Returns(nn.Module):
    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def forward(self, x: Tensor) -> Tensor:
        return self.make(x)


@pytest.mark.parametrize("make, message", [
    (lambda x: x.double(), "extern 'f' returned a torch.float64 tensor, expected torch.float32"),
    (lambda x: x > 0, "extern 'f' returned a torch.bool tensor, expected torch.float32"),
    (lambda x: torch.empty(x.shape, device="meta"), "extern 'f' returned a tensor on meta, expected cpu, where "
                                                    "its input is"),
])
def test_an_extern_result_of_the_right_shape_but_another_dtype_or_device_is_e0721(make: Any, message: str) -> None:
    d = _refused(_bound(Returns(make)), _x(2, 3, 8))
    assert (d.code, str(d.span), d.message) == ("E0721", "t.block:9:3", message)


# ------------------------------------------------------------ inputs


def test_a_call_with_too_few_or_too_many_inputs_names_the_expected_ones() -> None:
    m = _compile(MLP)
    d = _refused(m)
    assert (d.code, str(d.span), d.message) == ("E0711", "t.block:13:7", "M takes 1 input (x); 'x' not given")
    assert d.hint == "call it as m(x, **context)"
    assert _refused(m, _x(2, 3, 8), _x(2, 3, 8)).message == "M takes 1 input (x), got 2"
    two = _compile(CROSS, params="x: [B, S, D], memory: [B, T, D]")
    assert _refused(two, _x(2, 3, 8)).message == "M takes 2 inputs (x, memory); 'memory' not given"


def test_an_input_in_another_dtype_or_on_another_device_names_the_module_s() -> None:
    m = _compile(MLP)
    d = _refused(m, _x(2, 3, 8).double())
    assert (d.code, str(d.span)) == ("E0708", "t.block:13:9")
    assert d.message == "input 'x' of M is torch.float64, but the module computes in torch.float32"
    assert d.hint == "cast it first: x.to(torch.float32), or convert the module: m.to(torch.float64)"
    d = _refused(m, torch.empty(2, 3, 8, device="meta"))
    assert d.message == "input 'x' of M is on meta, but the module's parameters are on cpu"
    assert m(_x(2, 3, 8).bfloat16()).shape == (2, 3, 8)  # a half-precision stream is mixed precision
    m.double()  # the contract follows the parameters
    assert m(_x(2, 3, 8).double()).dtype == torch.float64
    assert _refused(m, torch.ones(2, 3, 8, dtype=torch.int64)).message == \
        "input 'x' of M must be a floating-point tensor, got torch.int64"


def test_token_ids_outside_the_vocabulary_are_e0712() -> None:
    text = HEADER + ("dim V: vocab = 11\nmodel E(ids: [B, S]) -> [B, S, D] {\n  embed: embedding(V, D)\n"
                     "  pos: embedding(S, D, positions=true)\n  n: rmsnorm(D)\n  x = embed(ids) + pos(ids)\n"
                     "  return n(x)\n}\n")
    m = blockir.compile(blockir.parse(text, "e.block"), "E", dims={"S": 4}, seed=0)
    assert m(torch.tensor([[0, 10, 3, 4]])).shape == (1, 4, 8)
    for bad, given in ((11, 11), (-1, -1)):
        d = _refused(m, torch.tensor([[0, bad, 3, 4]]))
        assert (d.code, str(d.span)) == ("E0712", "e.block:8:9")
        assert d.message == f"input 'ids' of E holds token id {given}, outside the vocabulary [0, 11)"


def test_a_position_table_looks_up_the_position_ids_it_is_given() -> None:
    text = HEADER + ("dim V: vocab = 11\nmodel E(ids: [B, S]) -> [B, S, D] {\n  embed: embedding(V, D)\n"
                     "  pos: embedding(S, D, positions=true)\n  n: rmsnorm(D)\n  x = embed(ids) + pos(ids)\n"
                     "  return n(x)\n}\n")
    m = blockir.compile(blockir.parse(text, "e.block"), "E", dims={"S": 4}, seed=0)
    assert m.blockir_contract.keywords == ("position_ids",)
    ids, reversed_ = torch.tensor([[0, 10, 3, 4]]), torch.tensor([[3, 2, 1, 0]])
    table, positions = m.get_parameter("embed.weight"), m.get_parameter("pos.weight")
    with torch.no_grad():
        torch.testing.assert_close(m(ids, position_ids=reversed_), m.n(table[ids] + positions[reversed_]))
        torch.testing.assert_close(m(ids), m.n(table[ids] + positions[:4]))


# ------------------------------------------------------------ public functions


@pytest.mark.parametrize("call, where, message, hint", [
    (lambda: blockir.compile("x.block", "M", dimss={"D": 4}), "blockir.compile(dimss=…)",
     "blockir.compile takes no argument 'dimss'",
     "did you mean 'dims'? blockir.compile takes: program, name, backend, dims, bind, dtype, device, seed, mode"),
    (lambda: blockir.compile("x.block"), "blockir.compile(name=…)", "blockir.compile needs the argument 'name'",
     "blockir.compile takes: program, name, backend, dims, bind, dtype, device, seed, mode"),
    (lambda: blockir.parse("dim D: model = 4", filenme="a.block"), "blockir.parse(filenme=…)",
     "blockir.parse takes no argument 'filenme'", "did you mean 'filename'? blockir.parse takes: text, filename"),
    (lambda: blockir.load("a.block", "b.block"), "blockir.load(path=…)",
     "blockir.load takes at most 1 positional arguments (path), got 2", "pass the others by keyword: "
                                                                        "blockir.load takes: path"),
    (lambda: blockir.parallelize(nn.Linear(2, 2), None, "x.block", "M", layuot="hidden"),
     "blockir.parallelize(layuot=…)", "blockir.parallelize takes no argument 'layuot'",
     "did you mean 'layout'? blockir.parallelize takes: module, mesh, program, name, layout, dims, vocab, mp_policy, load_balance, "
     "src_data_rank"),
    (lambda: blockir.reconcile(blockir.parse("dim D: model = 4"), "M", {}, dim={}), "blockir.reconcile(dim=…)",
     "blockir.reconcile takes no argument 'dim'", None),
])
def test_an_unknown_argument_to_a_public_function_is_e0722(call: Any, where: str, message: str,
                                                          hint: str | None) -> None:
    with pytest.raises(blockir.BlockError) as info:
        call()
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span), d.message) == ("E0722", where, message)
    if hint is not None:
        assert d.hint == hint
    else:
        assert d.hint.startswith("did you mean 'dims'?")


def test_dims_whose_parameters_would_not_fit_are_refused_before_allocating() -> None:
    with pytest.raises(blockir.BlockError) as info:
        _compile(MLP, dims={"D": 1 << 20, "F": 1 << 22})
    (d,) = info.value.diagnostics
    assert (d.code, str(d.span)) == ("E0706", "t.block:13:7")
    d_, f_ = 1 << 20, 1 << 22
    layer = d_ + (d_ * f_ + f_) + (f_ * d_ + d_)  # rmsnorm, then the mlp's fc1 and fc2 with their biases
    count = 2 * layer + d_
    assert d.message.startswith(f"compiling 'M' would allocate {count * 4 / (1 << 30):,.1f} GiB of parameters "
                                f"({count:,} of 4 bytes), more than the ")
    # on the meta device nothing is allocated: the same sizes build
    assert _compile(MLP, dims={"D": 1 << 20, "F": 1 << 22}, device="meta").blockir_contract.device.type == "meta"


def test_a_rotary_attention_rotates_by_the_position_ids_it_is_given() -> None:
    m = blockir.compile(ROOT / "examples" / "llama.block", "LlamaDecoderLayer", seed=0).eval()
    x, strided = _x(2, 5, 64), 2 * torch.arange(5)[None]
    # RoPE's tables at those positions, rotate-half layout: head_dim 16, theta 10000
    angles = strided[..., None].float() / 10000.0 ** (torch.arange(0, 16, 2).float() / 16)
    angles = torch.cat((angles, angles), dim=-1)
    with torch.no_grad():
        got = m(x, position_ids=strided)
        torch.testing.assert_close(got, m(x, position_embeddings=(angles.cos(), angles.sin())), rtol=1e-6, atol=1e-6)
        assert (got - m(x)).abs().max() > 1e-2  # the positions were not ignored


def test_a_cache_that_is_not_a_kv_cache_is_refused() -> None:
    m = _compile(ATTENTION.format(rope=""))
    d = _refused(m, _x(2, 3, 8), past_key_values=((torch.zeros(1),),))
    assert (d.code, d.message) == ("E0838", "past_key_values must be a blockir.KVCache, got tuple")
