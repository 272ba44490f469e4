"""The residual-update ledger: a worked example, hand-counted blocks, fused byte counts, saved bytes."""
from __future__ import annotations

import functools
import importlib.util
import io
import json
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType

import pytest
import torch

import blockir
from blockir.lower.layers.norm_module import Norm
from blockir.reports.cost import CostError, FusedBoundary, fused_boundary_bytes, ledger, ledger_data
from blockir.cli import main
from blockir.ir.program import Program
from blockir.ir.types import DType
from conftest import ROOT

B, S, D = 8, 2048, 4096
SEED_DIMS = {"B": B, "S": S, "D": D}
ROWS = B * S
E = B * S * D * 2  # one [B, S, D] bf16 tensor in bytes

MERGE = """
dim B: batch
dim S: seq
dim D: model
block Merge(x: [B, S, D]) -> [B, S, D] {
  u: extern(x: [B, S, D]) -> [B, S, D]
  y = x + u(x)
  return y
}
"""


@functools.cache
def load_script(name: str) -> ModuleType:
    """A benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def example(name: str) -> Program:
    return blockir.load(ROOT / "examples" / f"{name}.block")


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# --- a worked example ------------------------------------------------------------

def test_seed_worked_example_standalone_add() -> None:
    led = ledger(blockir.parse(MERGE), "Merge", SEED_DIMS, DType.BF16)
    merge = led.total
    assert merge.residual_elements == 67_108_864
    assert merge.bytes_per_tensor == 134_217_728 == 128 * 2**20
    assert merge.unfused.adds == 1
    # read the old residual and the update, write the new residual: 384 MiB
    assert merge.unfused.bytes_moved == 402_653_184 == 384 * 2**20
    assert merge.fused.bytes_moved == 402_653_184  # no norm follows: nothing to fuse
    assert merge.unfused.saved_bytes == 0  # an add keeps nothing for backward
    assert merge.unfused.norm_parameters == 0 and merge.unfused.reductions_forward == 0


def test_seed_worked_example_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "merge.block"
    path.write_text(MERGE)
    code, out, _ = run_cli("cost", str(path), "--dims", "B=8,S=2048,D=4096", "--dtype", "bf16")
    assert code == 0
    lines = {line.split("  ")[0]: line.split()[-2:] for line in out.splitlines() if "  " in line}
    assert lines["residual elements"][-1] == "67,108,864"
    assert lines["bytes per residual tensor"] == ["128.00", "MiB"]
    assert lines["bytes moved, unfused"] == ["384.00", "MiB"]
    assert "Branch internals (attention, MLP" in out


# --- hand-counted blocks ----------------------------------------------------------------------------

def test_llama_layer_and_model_against_hand_counts() -> None:
    led = ledger(example("llama"), "LlamaModel", SEED_DIMS, DType.BF16)
    layer, model = led.blocks
    assert (layer.name, layer.instances, model.name, model.instances) == ("LlamaDecoderLayer", 2, "LlamaModel", 1)
    rms = 2 * E + 2 * D + 4 * ROWS  # read x, read weight, write y, write fp32 rstd per row
    assert layer.unfused.adds == 2
    assert layer.unfused.norm_params == {"rmsnorm": 2 * D}
    assert (layer.unfused.reductions_forward, layer.unfused.reductions_backward) == (2 * ROWS, 2 * ROWS)
    assert layer.unfused.bytes_moved == 2 * rms + 2 * 3 * E == 1_342_324_736
    # the fusion pass fuses h = x + attn(...) with post_attention_layernorm(h): one read and one write fewer
    fused_boundary = 4 * E + 2 * D + 4 * ROWS
    assert layer.fused.bytes_moved == rms + fused_boundary + 3 * E == layer.unfused.bytes_moved - E
    assert layer.unfused.saved_bytes == layer.fused.saved_bytes == 2 * (E + 4 * ROWS)
    # two layers and the final norm
    assert model.unfused.adds == 4
    assert model.unfused.norm_params == {"rmsnorm": 5 * D}
    assert model.unfused.reductions_forward == 5 * ROWS
    assert model.unfused.bytes_moved == 2 * layer.unfused.bytes_moved + rms == 2_953_158_656
    # compiled fused, the stack is inlined: each layer's last add fuses with the next norm (layer 1's
    # input norm, then the final norm), saving one more [B,S,D] round trip per layer
    assert model.fused.bytes_moved == 2 * layer.fused.bytes_moved + rms - 2 * E
    assert model.unfused.saved_bytes == 5 * (E + 4 * ROWS)


def test_bert_post_ln_against_hand_counts() -> None:
    layer = ledger(example("bert"), "BertLayer", SEED_DIMS, DType.BF16).total
    ln = 2 * E + 2 * 2 * D + 2 * 4 * ROWS  # read, weight + bias, write, mean + rstd
    sublayer = 2 * E + 3 * E + ln  # dropout (mask regenerated), add, LayerNorm
    assert layer.unfused.adds == 2
    assert layer.unfused.norm_params == {"layernorm": 2 * 2 * D}
    assert (layer.unfused.reductions_forward, layer.unfused.reductions_backward) == (4 * ROWS, 4 * ROWS)
    assert layer.unfused.bytes_moved == 2 * sublayer
    # dropout, add and LayerNorm become one kernel: read branch and residual, write normalized and residual
    assert layer.fused.bytes_moved == 2 * (4 * E + 2 * 2 * D + 2 * 4 * ROWS)
    assert layer.fused.bytes_moved == 2 * fused_boundary_bytes("layernorm", ROWS, D, 2)
    assert layer.unfused.saved_bytes == layer.fused.saved_bytes == 2 * (E + 2 * 4 * ROWS)


def test_learned_scales_and_drop_path_are_counted() -> None:
    # LayerScale: drop_path(gamma * attn(norm1(x))) is not fusable (the scale sits inside the drop path)
    dims = {"B": 2, "S": 16, "D": 64}
    e, rows, d = 2 * 16 * 64 * 4, 2 * 16, 64
    block = ledger(example("layerscale"), "LayerScaleBlock", dims, DType.F32).total
    ln = 2 * e + 2 * d * 4 + 2 * rows * 4
    sublayer = ln + (2 * e + d * 4) + 2 * e + 3 * e  # norm, learned scale (reads its vector), drop path, add
    assert block.unfused.bytes_moved == block.fused.bytes_moved == 2 * sublayer
    # the norm keeps its input and statistics, the learned scale keeps its input
    assert block.unfused.saved_bytes == 2 * (e + 2 * rows * 4 + e)


def test_layer_dependent_dropout_is_evaluated_per_layer() -> None:
    text = """
dim B: batch
dim S: seq
dim D: model = 8
block L(x: [B, S, D]) -> [B, S, D] {
  u: extern(x: [B, S, D]) -> [B, S, D]
  y = x + drop_path(u(x), p=0.1 * layer / num_layers)
  return y
}
model M(x: [B, S, D]) -> [B, S, D] {
  layers: L * 4
  const final_norm = 0
  return layers(x)
}
"""
    led = ledger(blockir.parse(text), "M", {"B": 1, "S": 2}, DType.F32)
    t = 1 * 2 * 8 * 4
    # layer 0 has p = 0, which lowers to nothing; the other three move the tensor through the drop path
    assert led.total.unfused.bytes_moved == 4 * 3 * t + 3 * 2 * t
    assert led.blocks[0].unfused.bytes_moved == 3 * t  # the block's column is its layer 0


def test_norm_parameters_equal_the_compiled_modules() -> None:
    for name, model in (("llama", "LlamaModel"), ("dyt", "DyTModel"), ("bert", "BertLayer"),
                        ("peri_ln", "PeriLNModel"), ("encoder_decoder", "Decoder")):
        program = example(name)
        dims = {"B": 2, "S": 4} | ({"T": 4} if name == "encoder_decoder" else {})
        bind = {}
        if name == "bert":
            bind = {"attention.self": torch.nn.Identity()}
        module = blockir.compile(program, model, dims=dims, bind=bind)
        norms = [m for m in module.modules() if isinstance(m, Norm)]
        counted = ledger(program, model, dims, DType.F32).total.unfused.norm_parameters
        assert counted == sum(p.numel() for m in norms for p in m.parameters(recurse=False)), name


# --- the fused boundary ------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("rows,width,dtype", [(4096, 4096, torch.bfloat16), (64, 320, torch.float32),
                                              (16384, 8192, torch.bfloat16)])
def test_benchmark_traffic_is_the_ledger_count(family: str, rows: int, width: int, dtype: torch.dtype) -> None:
    bench = load_script("fused_norm")
    full, row, param = rows * width * dtype.itemsize, rows * 4, width * dtype.itemsize
    params = stats = 2 if family == "layernorm" else 1
    forward = 2 * full + params * param + 2 * full + stats * row
    backward = 3 * full + stats * row + param + 2 * full + params * param
    problem = bench.Problem(family, rows, width, dtype, "cpu")
    assert problem.traffic(False) == forward == fused_boundary_bytes(family, rows, width, dtype.itemsize)
    assert problem.traffic(True) == forward + backward


def test_fused_boundary_mixed_dtypes_and_learned_scale() -> None:
    # bf16 branch into an fp32 residual, LayerScale vector: every tensor at its own width
    b = FusedBoundary("rmsnorm", rows=10, width=8, itemsize=2, residual_itemsize=4, output_itemsize=4,
                      scale_elements=8)
    assert b.forward_bytes() == 80 * 2 + 80 * 4 + 8 * 4 + 8 * 2 + 80 * 4 + 80 * 4 + 10 * 4
    assert b.saved_bytes() == 80 * 4 + 10 * 4 + 80 * 2


def test_fused_learned_scale_reads_the_gain_and_keeps_the_branch() -> None:
    text = """
dim B: batch
dim S: seq
dim D: model = 16
block Gated(x: [B, S, D]) -> [B, S, D] {
  u: extern(x: [B, S, D]) -> [B, S, D]
  g: vector(D, init=0.1)
  n: rmsnorm(D)
  y = n(x + g * u(x))
  return y
}
"""
    block = ledger(blockir.parse(text), "Gated", {"B": 2, "S": 3}, DType.F32).total
    rows, e = 6, 6 * 16 * 4
    boundary = FusedBoundary("rmsnorm", rows, 16, 4, 4, 4, scale_elements=16)
    assert block.fused.bytes_moved == boundary.forward_bytes() == 4 * e + 16 * 4 + 16 * 4 + rows * 4
    assert block.fused.saved_bytes == boundary.saved_bytes() == 2 * e + rows * 4
    # unfused: g * u reads u and g and keeps u; the add; the norm keeps its input and rstd
    assert block.unfused.bytes_moved == (2 * e + 16 * 4) + 3 * e + (2 * e + 16 * 4 + rows * 4)
    assert block.unfused.saved_bytes == 2 * e + rows * 4


def test_fused_saved_bytes_match_the_measured_storages() -> None:
    bench = load_script("saved_bytes")
    shape = (2, 4, 64)
    rows, width = 8, 64
    for dtype in (torch.float32, torch.bfloat16):
        size = dtype.itemsize
        rms = FusedBoundary("rmsnorm", rows, width, size, size, size)
        ln = FusedBoundary("layernorm", rows, width, size, size, size, bias=True)
        scaled = FusedBoundary("rmsnorm", rows, width, size, size, size, scale_elements=width)
        # the hooks also see the parameters and the dropout key, which are resident anyway
        expected = {"fused add_rms_norm": rms.saved_bytes() + width * size,
                    "fused add_rms_norm, dropout p=0.1": rms.saved_bytes() + width * size + 8,
                    "fused add_layer_norm": ln.saved_bytes() + 2 * width * size,
                    "fused add_rms_norm, learned LayerScale": scaled.saved_bytes() + 2 * width * size}
        for name, fn in bench.boundaries(shape, dtype, "cpu").items():
            if name in expected:
                assert bench.saved_bytes(fn)[0] == expected[name], (name, dtype)


def test_fused_saved_bytes_reproduce_the_published_table() -> None:
    # docs/fused.md, [B, S, D] = [4, 512, 1024]: saved bytes as a multiple of one [B, S, D] tensor
    rows, width = 4 * 512, 1024
    table = {(torch.float32, "rms"): "1.001", (torch.float32, "ln"): "1.003", (torch.float32, "ls"): "2.002",
             (torch.bfloat16, "rms"): "1.002", (torch.bfloat16, "ln"): "1.005", (torch.bfloat16, "ls"): "2.003"}
    for (dtype, kind), published in table.items():
        size = dtype.itemsize
        b = FusedBoundary("layernorm" if kind == "ln" else "rmsnorm", rows, width, size, size, size,
                          bias=kind == "ln", scale_elements=width if kind == "ls" else 0)
        params = width * size * (2 if kind in ("ln", "ls") else 1)
        assert f"{(b.saved_bytes() + params) / (rows * width * size):.3f}" == published


# --- the command ---------------------------------------------------------------------------------------

def test_cost_json_is_exact() -> None:
    code, out, _ = run_cli("cost", str(ROOT / "examples" / "llama.block"), "--dims", "B=8,S=2048,D=4096",
                           "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["block"] == "LlamaModel" and data["dtype"] == "bf16" and data["mode"] == "train"
    assert data["total"]["bytes_moved"] == {"unfused": 2_953_158_656, "fused": 2_684_723_200 - 2 * 2**27}
    assert data["total"]["residual_adds"] == 4 and data["blocks"][0]["instances"] == 2
    assert "branch internals" in data["scope"]


def test_cost_usage_errors() -> None:
    llama = str(ROOT / "examples" / "llama.block")
    code, _, err = run_cli("cost", llama, "--dims", "B=8,D=4096")
    assert code == 2 and "dim 'S' has no size" in err
    code, _, err = run_cli("cost", llama, "--dims", "B=8,S=2,Q=3")
    assert code == 1 and "error[E0702]: unknown dim(s) in dims=: Q" in err
    with pytest.raises(CostError, match="no block named 'Nope'"):
        ledger(example("llama"), "Nope", SEED_DIMS)


def test_ledger_data_round_trips_through_json() -> None:
    led = ledger(example("encoder_decoder"), "Decoder", {"B": 2, "S": 8, "T": 4}, DType.F16)
    data = json.loads(json.dumps(ledger_data(led)))
    layer = data["blocks"][0]
    # three residual updates per decoder layer, on T rows (the memory's S rows are the branch's business)
    assert layer["residual_adds"] == 3 and layer["rows"] == 2 * 4
    assert data["total"]["residual_adds"] == 18
    assert Path(data["file"]).name == "encoder_decoder.block"
