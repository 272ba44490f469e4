"""Unit-offset gains, learned biases and elementwise gates against their equations, in float64.

Every construct is compiled by both backends, its parameters are moved off
their init, and the output and the gradient of every input and parameter
are compared with the equation written here in plain PyTorch.
"""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.analyses.keys import param_keys
from blockir.analyses.structure import wrapper
from blockir.ir.printer import format_program
from oracle import assert_matches_reference

HEADER = """
dim B: batch
dim S: seq
dim D: model = 8
dim F: hidden = 16
"""
D = 8
BACKENDS = ("fx", "fused")
Reference = Callable[[Tensor, dict[str, Tensor]], Tensor]


def _program(body: str) -> blockir.Program:
    return blockir.parse(HEADER + body)


def _check(body: str, reference: Reference, backend: str, shape: tuple[int, ...] = (2, 3, D)) -> None:
    """Forward and every gradient of the compiled block ``T`` against ``reference(x, params)``."""
    m = blockir.compile(_program(body), "T", seed=0, backend=backend, dtype=torch.float64)
    assert_matches_reference(m, reference, shape)


def _ln(x: Tensor, eps: float) -> Tensor:
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)


# ------------------------------------------------------------ unit-offset gains

OFFSET_NORMS = {
    "layernorm(D, eps=0.1, accum=f64, offset=1)":
        lambda x, p: (1 + p["n.weight"]) * _ln(x, 0.1) + p["n.bias"],
    "dyt(D, alpha=0.7, offset=1)":
        lambda x, p: (1 + p["n.weight"]) * torch.tanh(p["n.alpha"] * x) + p["n.bias"],
    "scalenorm(D, eps=1e-5, offset=1)":
        lambda x, p: (1 + p["n.scale"]) * x / x.norm(dim=-1, keepdim=True).clamp_min(1e-5),
    "rmsnorm(D, eps=0.1, accum=f64, offset=1)":
        lambda x, p: (1 + p["n.weight"]) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 0.1),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("decl", OFFSET_NORMS)
def test_unit_offset_norm_is_its_equation(decl: str, backend: str) -> None:
    body = f"block T(x: [B, S, D]) -> [B, S, D] {{\n  n: {decl}\n  y = n(x)\n  return y\n}}"
    _check(body, OFFSET_NORMS[decl], backend)


@pytest.mark.parametrize("decl", OFFSET_NORMS)
def test_unit_offset_norm_starts_at_unit_scale(decl: str) -> None:
    plain = decl.replace(", offset=1", "")
    body = "block T(x: [B, S, D]) -> [B, S, D] {{\n  n: {}\n  y = n(x)\n  return y\n}}"
    x = torch.randn(2, 3, D, dtype=torch.float64)
    offset = blockir.compile(_program(body.format(decl)), "T", seed=0, dtype=torch.float64)
    base = blockir.compile(_program(body.format(plain)), "T", seed=0, dtype=torch.float64)
    torch.testing.assert_close(offset(x), base(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unit_offset_layerscale_and_scalar(backend: str) -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  n: layernorm(D, accum=f64)
  ff: linear(D, D)
  ls: vector(D, init=0.1, offset=1)
  g: scalar(init=1, offset=1)
  h = x + ls * ff(n(x))
  y = h + g * ff(n(h))
  return y
}"""

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        def n(v: Tensor) -> Tensor:
            return p["n.weight"] * _ln(v, 1e-5) + p["n.bias"]

        def ff(v: Tensor) -> Tensor:
            return F.linear(v, p["ff.weight"], p["ff.bias"])

        h = x + (1 + p["ls"]) * ff(n(x))
        return h + (1 + p["g"]) * ff(n(h))

    _check(body.replace("  n: layernorm(D, accum=f64)", "  n: layernorm(D, accum=f64, tied=true)"), ref, backend)


def test_offset_gain_init_is_the_initial_gain() -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  ls: vector(D, init=0.1, offset=1)
  g: scalar(init=0, offset=1)
  y = x + g * (ls * x)
  return y
}"""
    m = blockir.compile(_program(body), "T", seed=0)
    # stored as deviations from one: the effective gains start at init
    torch.testing.assert_close(m.ls.detach(), torch.full((D,), -0.9))
    assert m.g.detach().item() == -1.0


# ------------------------------------------------------------ learned bias

@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_vector_is_added(backend: str) -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D, accum=f64)
  up: linear(D, F, bias=false)
  b_up: bias(F)
  down: linear(F, D, bias=false)
  y = x + down(gelu(up(n(x)) + b_up)) + attn_bias
  attn_bias: bias(D, init=0.5)
  return y
}"""

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        nx = p["n.weight"] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        u = F.linear(F.gelu(F.linear(nx, p["up.weight"]) + p["b_up"]), p["down.weight"])
        return x + u + p["attn_bias"]

    _check(body, ref, backend)


def test_bias_keys_and_init() -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  ff: linear(D, D, bias=false)
  ff.b: bias(D, init=0.25)
  y = x + (ff(x) + ff.b)
  return y
}"""
    m = blockir.compile(_program(body), "T", seed=0)
    assert set(m.state_dict()) == {"ff.weight", "ff.b"}
    table = param_keys(_program(body), "T")
    assert {k.name: k.shape for k in table.keys} == {"ff.weight": (D, D), "ff.b": (D,)}
    torch.testing.assert_close(m.ff.b.detach(), torch.full((D,), 0.25))


# ------------------------------------------------------------ gates

GRU = """
block T(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, accum=f64)
  gate: linear(D, D)
  ff: linear(D, D)
  n = ln(x)
  z = sigmoid(gate(n))
  y = z * x + (1 - z) * tanh(ff(n))
  return y
}"""


def _gru_ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    n = p["ln.weight"] * _ln(x, 1e-5) + p["ln.bias"]
    z = torch.sigmoid(F.linear(n, p["gate.weight"], p["gate.bias"]))
    return z * x + (1 - z) * torch.tanh(F.linear(n, p["ff.weight"], p["ff.bias"]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_residual_is_its_equation(backend: str) -> None:
    _check(GRU, _gru_ref, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_glu_spelled_with_linears(backend: str) -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D, accum=f64)
  a: linear(D, F, bias=false)
  b: linear(D, F, bias=false)
  down: linear(F, D, bias=false)
  h = n(x)
  y = x + down(sigmoid(a(h)) * b(h) + erf(a(h)) * tanh(b(h)))
  return y
}"""

    def ref(x: Tensor, p: dict[str, Tensor]) -> Tensor:
        h = p["n.weight"] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
        a, b = F.linear(h, p["a.weight"]), F.linear(h, p["b.weight"])
        return x + F.linear(torch.sigmoid(a) * b + torch.erf(a) * torch.tanh(b), p["down.weight"])

    _check(body, ref, backend)


def test_gated_residual_is_one_update_with_gated_shortcut_and_branch() -> None:
    block = _program(GRU).block("T")
    (sub,) = wrapper(block).sublayers
    assert sub.shortcut is not None and len(sub.shortcut_gates) == 1
    assert sub.shortcut_gates[0].operands == ("z", "x")
    (branch,) = sub.branches
    assert len(branch.gates) == 1 and branch.kind == "linear"
    assert [d for d in blockir.verify(_program(GRU)) if d.is_error] == []


def test_gate_on_the_shortcut_only_is_reported() -> None:
    body = GRU.replace("(1 - z) * tanh(ff(n))", "tanh(ff(n))")
    diags = [d for d in blockir.verify(_program(body)) if d.is_error]
    assert [d.code for d in diags] == ["E0414"]
    assert diags[0].message == ("the shortcut is gated by 'z' but the update 'tanh(…)' is not: the gate shrinks "
                                "the state and the update still adds in full")


def test_bias_along_the_wrong_axis_is_reported() -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  down: linear(F, D)
  b: bias(D)
  y = x + down(up(x) + b)
  return y
}"""
    diags = [d for d in blockir.verify(_program(body)) if d.is_error]
    assert [d.code for d in diags] == ["E0213"]
    assert "bias 'b' runs along D, but 'up(…)' is [B, S, F]" in diags[0].message


def test_product_of_different_axes_is_reported() -> None:
    body = """
block T(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  down: linear(F, D)
  y = x + down(up(x) * sigmoid(x))
  return y
}"""
    diags = [d for d in blockir.verify(_program(body)) if d.is_error]
    assert [d.code for d in diags] == ["E0203"]
    assert diags[0].message == "'up(…)' has width F, the stream has width D ([B, S, F] vs [B, S, D])"


def test_only_one_minus_subtracts_a_tensor() -> None:
    body = GRU.replace("(1 - z)", "(2 - z)")
    with pytest.raises(blockir.BlockError) as info:
        _program(body)
    assert info.value.diagnostics[0].code == "E0111"
    assert info.value.diagnostics[0].message == "only '1 - z' subtracts a tensor"


@pytest.mark.parametrize("body", [GRU, """
block T(x: [B, S, D]) -> [B, S, D] {
  ln: layernorm(D, offset=1)
  d: dyt(D, offset=1)
  ls: vector(D, init=1e-5, offset=1)
  b: bias(D)
  y = x + ls * d(ln(x)) + b
  return y
}"""])
def test_new_constructs_round_trip(body: str) -> None:
    program = _program(body)
    printed = format_program(program)
    assert blockir.parse(printed) == program
    assert format_program(blockir.parse(printed)) == printed


def test_gated_residual_cost_counts_the_products() -> None:
    from blockir.reports.cost import ledger

    (cost,) = ledger(_program(GRU), "T", dims={"B": 2, "S": 3}).blocks
    t = 2 * 3 * D * 2  # one bf16 tensor
    stats, ln_weights = 2 * 6 * 8, 2 * D * 2  # f64 statistics
    # ln(x), the gated shortcut z * x, the gated update (1 - z) * tanh(…), the add; 1 - z is inside the branch
    assert cost.unfused.bytes_moved == (2 * t + ln_weights + stats) + 3 * t + 3 * t + 3 * t
    # x and the statistics for the norm; z, 1 - z and tanh(…) for the two products (x counted once)
    assert cost.unfused.saved_bytes == t + stats + 3 * t


@pytest.mark.parametrize(("decl", "fused"), [("layernorm(D, offset=1)", False), ("rmsnorm(D, offset=1)", True)])
def test_fusion_keeps_offsets_the_kernels_lack(decl: str, fused: bool) -> None:
    from blockir.passes.fuse import fuse_program

    body = f"""
block T(x: [B, S, D]) -> [B, S, D] {{
  n: {decl}
  ff: linear(D, D)
  ls: vector(D, offset=1)
  y = n(x + ls * ff(x))
  return y
}}"""
    program, changed = fuse_program(_program(body))
    assert changed == fused
    if fused:  # the (1 + g) gain stays its own op, outside the kernel
        assert "ls * " in format_program(program) and "branch_scale" not in format_program(program)
