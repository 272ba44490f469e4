"""nGPT (Loshchilov et al., arXiv:2410.01131): the compiled example against the paper's equations in
float64, the optimizer-step projection, the verifier's reading of the update, and the run telemetry."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import blockir
from blockir.analyses.classify import classify
from blockir.analyses.hypersphere import SphereParameter, sphere_parameters
from blockir.ngpt import parameter_norm_error, project, project_after_step

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "ngpt.block"
D, H, FF, B, S = 64, 4, 256, 2, 5


def unit(t: Tensor) -> Tensor:
    return t / t.norm(dim=-1, keepdim=True)


def rope(t: Tensor) -> Tensor:
    """Rotate-half RoPE, base 10000, its tables in float32 as the reference implementations compute them."""
    hd = t.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.arange(t.shape[-2]).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    turned = torch.cat((-t[..., hd // 2:], t[..., :hd // 2]), dim=-1)
    return t * angles.cos().to(t.dtype) + turned * angles.sin().to(t.dtype)


def oracle(x: Tensor, p: dict[str, Tensor]) -> Tensor:
    """One nGPT layer written from the paper's equations."""
    hd = D // H
    rate = 0.05 / D ** -0.5  # alpha = alpha_param * (alpha_init / alpha_scale)

    def heads(t: Tensor) -> Tensor:
        return t.view(B, S, H, hd).transpose(1, 2)

    q, k, v = (heads(x @ p[f"attn.{n}_proj.weight"].T) for n in "qkv")
    s_qk = (p["attn.qk_scale"] * D ** 0.5).view(H, 1, hd)
    q, k = s_qk * unit(rope(q)), s_qk * unit(rope(k))
    scores = q @ k.transpose(-1, -2) * hd ** 0.5  # sqrt(d_k), not 1/sqrt(d_k): q and k are unit vectors
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, S, D) @ p["attn.o_proj.weight"].T
    h = unit(x + rate * p["alpha_a"] * (unit(a) - x))
    u = p["s_u"] * (h @ p["up.weight"].T)
    nu = p["s_v"] * (h @ p["gate.weight"].T) * D ** 0.5
    m = (u * F.silu(nu)) @ p["down.weight"].T
    return unit(h + rate * p["alpha_m"] * (unit(m) - h))


def _layer(backend: str = "fx") -> torch.nn.Module:
    layer = blockir.compile(EXAMPLE, "NGPTLayer", backend=backend, dims={"B": B, "S": S}, dtype=torch.float64, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # move every gain off its initial value, so each gradient is a different number
        for name, w in layer.named_parameters():
            if w.dim() == 1:
                w.mul_(1 + 0.5 * torch.rand(w.shape, generator=gen, dtype=w.dtype))
    return layer


@pytest.mark.parametrize("backend", ["fx", "fused"])
def test_layer_matches_the_paper_forward_and_every_gradient(backend: str) -> None:
    layer = _layer(backend)
    params = dict(layer.named_parameters())
    assert sorted(params) == sorted(["attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                                     "attn.o_proj.weight", "attn.qk_scale", "alpha_a", "gate.weight", "up.weight",
                                     "down.weight", "s_u", "s_v", "alpha_m"])
    x = unit(torch.randn(B, S, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    ref_params = {n: w.detach().clone().requires_grad_() for n, w in params.items()}
    y, y_ref = layer(x), oracle(x_ref, ref_params)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(B, S, dtype=torch.float64), rtol=0, atol=1e-12)
    probe = torch.randn(B, S, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (y * probe).sum().backward()
    (y_ref * probe).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=1e-12)
    for name, w in params.items():
        assert w.grad is not None and w.grad.abs().max() > 0, name
        torch.testing.assert_close(w.grad, ref_params[name].grad, rtol=0, atol=1e-12, msg=name)


def test_sphere_parameters_name_the_embedding_axis_of_each_matrix() -> None:
    program = blockir.load(EXAMPLE)
    assert sphere_parameters(program.block("NGPTLayer")) == (
        SphereParameter("attn.q_proj.weight", 1), SphereParameter("attn.k_proj.weight", 1),
        SphereParameter("attn.v_proj.weight", 1), SphereParameter("attn.o_proj.weight", 0),
        SphereParameter("gate.weight", 1), SphereParameter("up.weight", 1), SphereParameter("down.weight", 0))
    assert sphere_parameters(program.block("NGPT")) == ()


def test_projection_after_a_step_puts_every_embedding_vector_on_the_sphere() -> None:
    model = blockir.compile(EXAMPLE, "NGPT", dims={"B": B, "S": S}, seed=0)
    assert parameter_norm_error(model) > 0.5  # default initialisation is nowhere near the sphere
    assert project(model) == 8 * 7
    assert parameter_norm_error(model) < 1e-6
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    handle = project_after_step(optimizer, model)
    gain_before = model.get_parameter("layers.0.s_u").detach().clone()
    model(torch.randn(B, S, D)).square().sum().backward()
    optimizer.step()
    for i in range(8):
        for key, axis in (("attn.q_proj.weight", 1), ("attn.o_proj.weight", 0), ("gate.weight", 1),
                          ("down.weight", 0)):
            w = model.get_parameter(f"layers.{i}.{key}").detach()
            torch.testing.assert_close(w.norm(dim=axis), torch.ones(w.shape[1 - axis]), rtol=0, atol=1e-6)
    # vectors are not projected: the MLP gain moved and keeps its own norm (16 at init)
    gain = model.get_parameter("layers.0.s_u").detach()
    assert not torch.equal(gain, gain_before) and gain.norm().item() > 15
    handle.remove()
    with torch.no_grad():
        model.get_parameter("layers.0.down.weight").mul_(2)
    optimizer.step()
    assert parameter_norm_error(model) > 0.5  # the hook is gone: nothing projects any more


NGPT_HEAD = """
dim B: batch
dim S: seq
dim D: model = 16
dim F: hidden = 32
"""


def _diags(body: str) -> list[tuple[str, int, int, str]]:
    program = blockir.parse(NGPT_HEAD + body, "t.block")
    return [(d.code, d.span.line, d.span.column, d.message) for d in blockir.verify(program) if d.is_error]


def test_interpolation_without_a_declared_sphere_is_missing_its_projection() -> None:
    assert _diags("""
block L(x: [B, S, D]) -> [B, S, D] {
  unit: l2norm(D)
  mlp: mlp(F)
  a: vector(D, init=0.05)
  y = unit(x + a * (unit(mlp(x)) - x))
  return y
}
""") == [("E0431", 11, 12, ("'L' moves its stream on the unit sphere by normalized interpolation, but declares no "
                           "hypersphere, so its matrices are never projected back onto the sphere after an optimizer "
                           "step"))]


def test_a_declared_sphere_with_an_ordinary_residual_add_is_not_ngpt() -> None:
    assert _diags("""
block L(x: [B, S, D]) -> [B, S, D] {
  unit: l2norm(D, hypersphere=true)
  mlp: mlp(F)
  a: vector(D, init=0.05)
  h = unit(x + a * (unit(mlp(x)) - x))
  y = unit(h + a * mlp(h))
  return y
}
""") == [("E0430", 12, 12, ("'L' declares the hypersphere, but this update is an ordinary residual add, not a "
                           "normalized interpolation"))]


def test_the_update_reads_as_one_residual_update_with_an_output_and_a_post_norm() -> None:
    program = blockir.load(EXAMPLE)
    c = classify(program, program.block("NGPTLayer"))
    assert (c.topology, c.placements, c.branch_order) == ("ngpt", ("out+post", "out+post"),
                                                          ("causal_self_attention", "mlp"))


def test_a_difference_of_tensors_needs_equal_axes() -> None:
    diags = _diags("""
block L(x: [B, S, D]) -> [B, S, D] {
  up: linear(D, F)
  y = x + (up(x) - x)
  return y
}
""")
    assert diags == [("E0203", 9, 7, "'… - …' has width F, the stream has width D ([B, S, F] vs [B, S, D])"),
                     ("E0203", 9, 12, "'up(…)' has width F, the stream has width D ([B, S, F] vs [B, S, D])")]


def test_run_reports_the_sphere_errors(tmp_path: Path) -> None:
    from blockir.cli import main
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = main(["run", str(EXAMPLE), "--block", "NGPTLayer", "--steps", "1", "--dims", "B=2,S=16",
                     "--data", str(text), "--format", "json"])
    assert code == 0
    sphere = json.loads(buf.getvalue())["sphere"]
    assert 0 <= sphere["hidden_row_norm_error"] < 1e-5 and 0 <= sphere["parameter_norm_error"] < 1e-5


def test_the_ledger_counts_a_difference_as_two_reads_and_a_write() -> None:
    from blockir.ir.types import DType
    from blockir.reports.cost import ledger
    program = blockir.parse("""
dim B: batch
dim S: seq
dim D: model
block Step(x: [B, S, D]) -> [B, S, D] {
  u: extern(x: [B, S, D]) -> [B, S, D]
  y = x + (u(x) - x)
  return y
}
""")
    e = 2 * 16 * 64 * 2  # one [B, S, D] bf16 tensor
    total = ledger(program, "Step", {"B": 2, "S": 16, "D": 64}, DType.BF16).total
    assert total.unfused.bytes_moved == 3 * e + 3 * e  # the difference, then the add
    assert total.unfused.saved_bytes == 0  # neither keeps anything for backward


def test_the_documented_layer_is_the_example() -> None:
    doc = (ROOT / "docs" / "ngpt.md").read_text()
    snippet = doc.split("```block\n", 1)[1].split("```", 1)[0]
    assert blockir.load(EXAMPLE) == blockir.parse(snippet, "ngpt.md")
