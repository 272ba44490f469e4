"""U-Net skips: an early state joined with a later one over D and projected 2D -> D by a linear."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import blockir
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "unet_skip.block"


def _skip_program(early_width: str, in_dim: str) -> str:
    return f"""dim B: batch
dim S: seq
dim D: model = 8
dim W: model = 4
dim E: model = 2 * D
dim G: model = D + W
block Layer(x: [B, S, D]) -> [B, S, D] {{
  mlp: mlp(E)
  y = x + mlp(x)
  return y
}}
model M(x: [B, S, D]) -> [B, S, D] {{
  down: Layer
  narrow: linear(D, W)
  skip: linear({in_dim}, D)
  up: Layer
  early = down(x)
  side = {early_width}
  joined = concat(side, up(early))
  return skip(joined)
}}
"""


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_skip_projects_the_joined_states_float64(backend: str) -> None:
    torch.manual_seed(0)
    m = blockir.compile(EXAMPLE, "UNet", backend=backend, dims={"D": 16, "E": 32, "F": 32}, dtype=torch.float64,
                        seed=0, mode="infer")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    y, values = blockir.trace(m, x)
    # the fused backend inlines stacks, so the stack results carry the last layer's names
    early, late = (values["early"], values["late"]) if backend == "fx" else (values["down.1.y"], values["mid.1.y"])
    assert values["joined"].shape == (2, 5, 32)
    want = F.linear(torch.cat([early, late], dim=-1), m.skip.weight, m.skip.bias)
    torch.testing.assert_close(values["%0"], want, rtol=1e-12, atol=1e-12)
    assert tuple(m.skip.weight.shape) == (16, 32)
    y.sum().backward()
    assert m.skip.weight.grad is not None and m.get_parameter("down.0.attn.q_proj.weight").grad is not None


def test_skip_of_matching_widths_checks_clean() -> None:
    assert [d for d in blockir.verify(blockir.parse(_skip_program("down(x)", "E"))) if d.is_error] == []


def test_skip_whose_widths_disagree_is_located() -> None:
    program = blockir.parse(_skip_program("narrow(early)", "G"), "skip.block")
    diags = [d for d in blockir.verify(program) if d.is_error]
    assert [(d.code, d.span.line, d.span.column, d.message) for d in diags] == [
        ("E0420", 19, 12, "skip joins 'up(…)' of width D with 'side' of width W")]


def test_skip_projection_of_the_wrong_width_is_located() -> None:
    program = blockir.parse(_skip_program("down(x)", "D"), "skip.block")
    diags = [d for d in blockir.verify(program) if d.is_error]
    assert [(d.code, d.span.line, d.span.column) for d in diags] == [("E0207", 20, 10)]
    assert "linear 'skip' maps D to D, but 'joined' is [B, S, D+D]" in diags[0].message


def test_joined_states_that_stay_wide_are_a_widened_stream() -> None:
    text = EXAMPLE.read_text().replace("skip: linear(E, D)", "skip: linear(E, E)")
    codes = [d.code for d in blockir.verify(blockir.parse(text, "wide.block")) if d.is_error]
    assert codes[0] == "E0205"


def test_sizes_given_at_compile_must_keep_the_join_and_its_projection_equal() -> None:
    """dims= may override the width of one side of a skip's projection; the other side must follow."""
    program = blockir.load(ROOT / "examples" / "unet_skip.block")
    dims = {"B": 2, "S": 3, "D": 8, "F": 8}
    with pytest.raises(blockir.BlockError) as info:
        blockir.compile(program, "UNet", dims=dims | {"E": 8})
    (d,) = info.value.diagnostics
    assert (d.code, d.span.line, d.span.column) == ("E0702", 30, 10)
    assert d.message == "with the sizes given, linear 'skip' reads E = 8 features, but what it projects joins D + D = 16"
    module = blockir.compile(program, "UNet", dims=dims | {"E": 16})
    assert module(torch.randn(2, 3, 8)).shape == (2, 3, 8)
