"""Attention options: RoPE context extension against float64 formulas (E0801), per-layer windows (E0802)."""
from __future__ import annotations

import math

import pytest
import torch

import blockir
from blockir.lower.layers.rotary import RopeScaling, inv_freq
from blockir.ir.printer import format_program

DIM, THETA = 64, 10000.0


def _base() -> list[float]:
    return [THETA ** (-2 * i / DIM) for i in range(DIM // 2)]


def _linear(factor: float) -> list[float]:
    return [f / factor for f in _base()]


def _llama3(factor: float, original: int, low: float, high: float) -> list[float]:
    out = []
    for f in _base():
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(f)
        elif wavelen > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def _yarn(factor: float, original: int, beta_fast: float, beta_slow: float) -> list[float]:
    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times in the context
        return DIM * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(THETA))

    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), DIM - 1)
    out = []
    for i, f in enumerate(_base()):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate (keep f), 1: interpolate (f / factor)
        out.append(f / factor * ramp + f * (1 - ramp))
    return out


CASES = [
    (RopeScaling("linear", 4.0), _linear(4.0)),
    (RopeScaling("llama3", 8.0, 512, 1.0, 4.0), _llama3(8.0, 512, 1.0, 4.0)),
    (RopeScaling("llama3", 32.0, 8192, 2.0, 8.0), _llama3(32.0, 8192, 2.0, 8.0)),
    (RopeScaling("yarn", 4.0, 2048), _yarn(4.0, 2048, 32.0, 1.0)),
    (RopeScaling("yarn", 16.0, 4096, beta_fast=16.0, beta_slow=2.0), _yarn(16.0, 4096, 16.0, 2.0)),
]


@pytest.mark.parametrize("scaling, want", CASES, ids=lambda v: getattr(v, "kind", ""))
def test_frequencies_follow_the_published_formulas(scaling: RopeScaling, want: list[float]) -> None:
    got = inv_freq(DIM, THETA, torch.device("cpu"), scaling)
    want_t = torch.tensor(want, dtype=torch.float64)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want_t, rtol=2e-6, atol=0)
    assert not torch.allclose(got.double(), torch.tensor(_base(), dtype=torch.float64), rtol=1e-3)


def test_yarn_scales_the_tables_by_its_attention_factor() -> None:
    assert RopeScaling("yarn", 4.0, 2048).table_factor() == 0.1 * math.log(4.0) + 1.0
    assert RopeScaling("yarn", 4.0, 2048, attention_factor=1.25).table_factor() == 1.25
    assert RopeScaling("llama3", 8.0, 512).table_factor() == 1.0


HEAD = """dim B: batch
dim S: seq
dim D: model = 64
block Layer(x: [B, S, D]) -> [B, S, D] {{
  norm: rmsnorm(D)
  attn: self_attention(heads=4, {args})
  h = x + attn(norm(x))
  return h
}}
"""


@pytest.mark.parametrize("args, message", [
    ("rope=true, rope_factor=2", "'attn' sets rope_factor but no rope_scaling"),
    ("rope_scaling=linear, rope_factor=2", "'attn' sets rope_scaling=linear but rope=false"),
    ("rope=true, rope_scaling=yarn, rope_factor=4", "rope_scaling=yarn of 'attn' needs rope_original_max"),
    ("rope=true, rope_scaling=linear, rope_factor=2, rope_beta_fast=8",
     "rope_scaling=linear of 'attn' does not read rope_beta_fast"),
    ("rope=true, rope_scaling=llama3, rope_factor=8, rope_original_max=64, rope_attention_factor=1",
     "rope_scaling=llama3 of 'attn' does not read rope_attention_factor"),
])
def test_e0801_arguments_that_do_not_fit(args: str, message: str) -> None:
    found = [(d.code, d.message, d.span.line, d.span.column) for d in blockir.verify(blockir.parse(HEAD.format(args=args)))]
    assert found == [("E0801", message, 6, 3)]


def test_scaling_arguments_round_trip_and_compile() -> None:
    args = "rope=true, rope_scaling=yarn, rope_factor=4, rope_original_max=16, rope_beta_fast=16, rope_freqs=input"
    program = blockir.parse(HEAD.format(args=args))
    assert blockir.verify(program) == []
    printed = format_program(program)
    assert "rope_freqs=input" in printed and "rope_scaling=yarn, rope_factor=4, rope_original_max=16" in printed
    assert blockir.parse(printed) == program
    module = blockir.compile(program, "Layer", seed=0)
    assert module.attn.rope_scaling == RopeScaling("yarn", 4.0, 16, beta_fast=16.0)


STACK = """dim B: batch
dim S: seq
dim D: model = 16
block Layer(x: [B, S, D]) -> [B, S, D] {{
  norm: rmsnorm(D)
  attn: self_attention(heads=2, rope=true, window={window})
  h = x + attn(norm(x))
  return h
}}

model Stack(x: [B, S, D]) -> [B, S, D] {{
  layers: Layer * 3
  norm: rmsnorm(D)
  return norm(layers(x))
}}
"""


def test_a_window_in_layer_alternates_sliding_and_full_layers() -> None:
    program = blockir.parse(STACK.format(window="2 * (1 + (-1) ** layer) / 2"))
    assert blockir.verify(program) == []
    model = blockir.compile(program, "Stack", seed=0)
    assert [layer.attn.core.window for layer in model.layers] == [2, None, 2]
    full = blockir.compile(blockir.parse(STACK.format(window="0")), "Stack", seed=0)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    full.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert not torch.equal(model(x), full(x))
        # window 0 is no window at all: the same as a window wider than the sequence
        wide = blockir.compile(blockir.parse(STACK.format(window="5")), "Stack", seed=0)
        wide.load_state_dict(model.state_dict())
        assert torch.equal(full(x), wide(x))


@pytest.mark.parametrize("window, got, note", [("1.5", "1.5", []), ("1 - layer", "-1", ["in layer 2 of 3"])])
def test_e0802_window_not_a_non_negative_integer(window: str, got: str, note: list[str]) -> None:
    (d,) = blockir.verify(blockir.parse(STACK.format(window=window)))
    assert (d.code, d.message, d.span.line, [n.message for n in d.notes]) == (
        "E0802", f"window of 'attn' must be a non-negative integer, got {got}", 6, note)


EMBED = """dim B: batch
dim S: seq
dim D: model = 8
dim V: vocab = 11
model M(input_ids: [B, S]) -> [B, S, D] {{
  e: embedding(V, D, padding_idx={row})
  return e(input_ids)
}}
"""


@pytest.mark.parametrize("row", ["11", "-12", "2.5"])
def test_e0803_padding_idx_outside_the_table(row: str) -> None:
    (d,) = blockir.verify(blockir.parse(EMBED.format(row=row)))
    assert (d.code, d.message, d.span.line) == (
        "E0803", f"padding_idx={row} of 'e' is not a row of its table of 11 rows", 6)


@pytest.mark.parametrize("row", [3, -8])
def test_the_padding_row_gets_no_gradient(row: int) -> None:
    program = blockir.parse(EMBED.format(row=row))
    assert blockir.verify(program) == []
    model = blockir.compile(program, "M", seed=0)
    ids = torch.tensor([[3, 1, 3, 7]])
    model(ids).sum().backward()
    want = torch.zeros(11, 8)
    want[1] = want[7] = 1.0  # row 3 (-8 from the end) is looked up twice and learns nothing
    assert torch.equal(model.e.weight.grad, want)
