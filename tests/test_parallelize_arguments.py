"""``parallelize`` checks its arguments before it changes anything, and leaves no process-wide state behind.

The argument checks come before any use of the mesh, so these need no process group; one world of two gloo
ranks checks the data-parallel batch slice on a real (dp, tp) mesh, a second call on the same module, the
FSDP2 units of a fused module's inlined layers, the fused ops' DTensor rules over both ranks, and the names of
the mesh's axes (``cp`` for the context layout, ``tp`` for the others).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

import blockir
from blockir.lower.distributed.tp import _batch_slice, _units
from blockir.lower.layers.numerics import BatchSlice
from conftest import ROOT
from dist_harness import run_world

LLAMA = ROOT / "examples" / "llama.block"
DROPOUT = """dim B: batch
dim S: seq
dim D: model = 8
block T(x: [B, S, D]) -> [B, S, D] {
  n: rmsnorm(D)
  y = x + dropout(n(x), p=0.5)
  return y
}
"""


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _refused(*args: Any, **kwargs: Any) -> blockir.Diagnostic:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parallelize(*args, **kwargs)
    (d,) = info.value.diagnostics
    return d


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return blockir.compile(LLAMA, "LlamaModel", seed=0)


@pytest.mark.parametrize("case, where, message", [
    ("linear", "module", "parallelize expects a module returned by blockir.compile, got Linear"),
    ("layer", "module", "parallelize expects a module returned by blockir.compile, got LlamaDecoderLayer"),
    ("other block", "name", "the module was compiled from block 'LlamaModel', not 'LlamaDecoderLayer'"),
    ("unknown block", "name", "no block named 'Llama'"),
    ("program", "program", "expected a Program or a path, got int"),
    ("layout", "layout", "unknown layout 'rows'; expected one of replicated, sequence, hidden, context"),
    ("vocab", "vocab", "vocab must be True or False, got 'yes'"),
    ("mp_policy", "mp_policy", "expected a torch.distributed.fsdp.MixedPrecisionPolicy, got str"),
    ("mesh", "mesh", "mesh must be a 1-D DeviceMesh (tensor or context parallel), a 2-D one named ('dp', 'tp') or "
     "a 3-D one named ('dp_replicate', 'dp_shard', 'tp'), 'cp' for 'tp' under the context layout"),
])
def test_a_call_parallelize_cannot_honour_is_refused_up_front(llama: nn.Module, case: str, where: str,
                                                             message: str) -> None:
    module, program, name, layout, vocab = llama, LLAMA, "LlamaModel", "sequence", False
    if case == "linear":
        module = nn.Linear(64, 64)
    elif case == "layer":
        module = llama.layers[0]
    elif case == "other block":
        name = "LlamaDecoderLayer"
    elif case == "unknown block":
        name = "Llama"
    elif case == "program":
        program = 3
    elif case == "layout":
        layout = "rows"
    elif case == "vocab":
        vocab = "yes"
    before = {k: v.clone() for k, v in module.state_dict().items()}
    extra = {"mp_policy": "bf16"} if case == "mp_policy" else {}
    d = _refused(module, (2, 2), program, name, layout=layout, vocab=vocab, **extra)
    assert (d.code, str(d.span), d.message) == ("E0722", f"blockir.parallelize({where}=…)", message)
    after = module.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("layout, vocab, balance, message, hint", [
    ("sequence", False, True, "load balancing orders the rows of the context layout, not the sequence layout's",
     "pass layout='context', or leave load_balance out"),
    ("context", True, True, "load balancing reorders the rows the head reads, which a vocabulary-parallel head "
     "leaves split", "leave vocab or load_balance out"),
    ("context", False, "yes", "load_balance must be True or False, got 'yes'", None)])
def test_load_balancing_is_the_context_layouts_alone(llama: nn.Module, layout: str, vocab: bool, balance: object,
                                                     message: str, hint: str | None) -> None:
    d = _refused(llama, (2, 2), LLAMA, "LlamaModel", layout=layout, vocab=vocab, load_balance=balance)
    assert (d.code, str(d.span), d.message, d.hint) == ("E0722", "blockir.parallelize(load_balance=…)", message, hint)


def test_a_fused_module_passes_the_argument_checks_under_every_layout() -> None:
    """Its add+norm boundaries run on rows split by sequence and, composed with the norm's feature-sharded path,
    on features split over ranks: every layout passes the module on to the next check, the mesh's."""
    module = blockir.compile(LLAMA, "LlamaModel", backend="fused", seed=0)
    for layout in ("sequence", "replicated", "hidden"):
        assert _refused(module, (2, 2), LLAMA, "LlamaModel", layout=layout).span.filename == "blockir.parallelize(mesh=…)"


def test_fsdp_units_of_a_fused_module_are_the_modules_its_graph_calls() -> None:
    """The fused backend inlines LLaMA's layers into the model's graph, so a layer never runs as a module:
    its branches (and layer 0's input norm, whose boundary has no add before it) are the units; the norms of the
    fused boundaries, read as attributes, stay with the root. A stack the backend left as modules keeps a unit
    per layer."""
    from blockir.analyses.parallel import derive_plan
    from blockir.analyses.sizes import Sizes
    program = blockir.load(LLAMA)
    plan = derive_plan(program, program.block("LlamaModel"), Sizes.of(program, {"B": 2, "S": 4}), "sequence", 2)
    fused = blockir.compile(LLAMA, "LlamaModel", backend="fused", seed=0)
    assert _units(fused, plan) == ["layers.0.input_layernorm", "layers.0.self_attn", "layers.0.mlp",
                                   "layers.1.self_attn", "layers.1.mlp"]
    assert _units(blockir.compile(LLAMA, "LlamaModel", seed=0), plan) == ["layers.0", "layers.1"]


def _masks() -> torch.Tensor:
    m = blockir.compile(blockir.parse(DROPOUT, "d.block"), "T", seed=0).train()
    torch.manual_seed(7)
    return m(torch.ones(2, 3, 8)) == 1  # 1 + a dropped 0 (a kept row of ones is 1 + 2)


def test_a_forward_that_raises_under_the_batch_slice_leaves_later_modules_their_own_masks() -> None:
    fresh = _masks()  # what any module draws with no data-parallel slice set
    m = blockir.compile(blockir.parse(DROPOUT, "d.block"), "T", seed=0).train()
    _batch_slice(m, 1, 2)  # the second of two data-parallel ranks
    torch.manual_seed(7)
    sliced = m(torch.ones(2, 3, 8)) == 1  # rows 2-3 of a batch of 4: other masks than rows 0-1
    assert not torch.equal(sliced, fresh)
    with pytest.raises(blockir.BlockError, match="axis D has size 4"):
        m(torch.ones(2, 3, 4))
    assert BatchSlice.current == (0, 1)
    assert torch.equal(_masks(), fresh)


# ------------------------------------------------------------ one real (dp, tp) mesh


def _fused_rules() -> dict[str, Any]:
    """The fused ops on DTensors over both ranks, the stream split by batch (0) or sequence (1), the norm's
    parameters replicated: each value's placement, and its largest relative error against plain tensors."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from blockir.lower.fused import add_layer_norm, add_rms_norm
    mesh = init_device_mesh("cpu", (2,))
    branch, residual, gy, gr = (_x(2, 4, 8, seed=s) for s in range(4))
    weight, bias = _x(8, seed=4), _x(8, seed=5)
    found: dict[str, Any] = {}
    for axis in (0, 1):
        # every rank holds the same full tensors: its DTensors are built from its own slices, with no collective
        def shard(t: torch.Tensor) -> DTensor:
            return DTensor.from_local(t.chunk(2, axis)[dist.get_rank()], mesh, [Shard(axis)], run_check=False)

        def whole(t: torch.Tensor) -> DTensor:
            return DTensor.from_local(t, mesh, [Replicate()], run_check=False)

        for family, op, params in (("layer", add_layer_norm, (weight, bias)), ("rms", add_rms_norm, (weight,))):
            def run(place: Any, replicate: Any) -> list[torch.Tensor]:
                leaves = [place(t).requires_grad_() for t in (branch, residual)] + \
                    [replicate(t).requires_grad_() for t in params]
                outputs = op(*leaves)
                torch.autograd.backward(outputs, [place(gy), place(gr)])
                return [*outputs] + [t.grad for t in leaves]
            want = run(torch.clone, torch.clone)
            got = run(shard, whole)
            found[f"{family} S({axis})"] = (
                [str(t.placements[0]) for t in got],
                max(((g.full_tensor() - w).norm() / w.norm()).item() for g, w in zip(got, want)))
    return found


def _body() -> dict[str, Any]:
    """What rank 0 of the two-rank world reports."""
    from torch.distributed.device_mesh import init_device_mesh
    fresh = _masks()
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    m = blockir.compile(LLAMA, "LlamaModel", seed=0)
    blockir.parallelize(m, mesh, LLAMA, "LlamaModel", layout="replicated", dims={"B": 2, "S": 4})
    results: dict[str, Any] = {}
    try:
        m(_x(1, 4, 32))
    except blockir.BlockError as exc:
        results["failed"] = exc.diagnostics[0].message
    results["slice"] = BatchSlice.current
    results["same masks"] = torch.equal(_masks(), fresh)
    try:
        blockir.parallelize(m, mesh, LLAMA, "LlamaModel", layout="replicated", dims={"B": 2, "S": 4})
    except blockir.BlockError as exc:
        results["twice"] = (exc.diagnostics[0].code, exc.diagnostics[0].message)
    results["fused rules"] = _fused_rules()
    # FSDP2 over the fused LLaMA, whose layers are inlined: the units its graph calls, and the root
    from torch.distributed.fsdp import FSDPModule
    fused = blockir.compile(LLAMA, "LlamaModel", backend="fused", seed=0)
    blockir.parallelize(fused, mesh, LLAMA, "LlamaModel", layout="sequence", dims={"B": 2, "S": 4})
    results["fused units"] = [path for path, sub in fused.named_modules() if isinstance(sub, FSDPModule)]
    results["axis names"] = _axis_names()
    results["sources"] = _sources()
    return results


def _sources() -> dict[str, Any]:
    """Each rank compiles LLaMA with its own seed and parallelises it under the sequence layout, taking the
    values from rank 0 (the default), from rank 1, or from each rank itself (None): whether each rank's
    replicated norm gain and its shard of a column-parallel weight equal the slices of rank 0's, rank 1's and
    its own compiled weights; then the refusals of a source outside the axis."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh, rank = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",)), dist.get_rank()
    keys = ("layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight")
    weights = [blockir.compile(LLAMA, "LlamaModel", seed=seed).state_dict() for seed in (0, 1)]
    out: dict[str, Any] = {}
    for source in (0, 1, None):
        m = blockir.compile(LLAMA, "LlamaModel", seed=rank)
        blockir.parallelize(m, mesh, LLAMA, "LlamaModel", dims={"B": 2, "S": 4}, src_data_rank=source)
        local = [m.get_parameter(k).to_local() for k in keys]
        expected = [weights[rank if source is None else source][k] for k in keys]
        expected[1] = expected[1].chunk(2)[rank]
        same = torch.tensor([all(torch.equal(a, b) for a, b in zip(local, expected))], dtype=torch.int64)
        dist.all_reduce(same)  # on both ranks
        out[str(source)] = int(same)
    for source in (2, "0", True):
        m = blockir.compile(LLAMA, "LlamaModel", seed=0)
        try:
            blockir.parallelize(m, mesh, LLAMA, "LlamaModel", dims={"B": 2, "S": 4}, src_data_rank=source)
        except blockir.BlockError as exc:
            (d,) = exc.diagnostics
            out[repr(source)] = (d.code, str(d.span), d.message, d.hint)
    return out


# (mesh shape, axis names, layout): a context-parallel axis is named cp, a tensor-parallel one tp
AXIS_NAMES = [((2,), ("cp",), "context"), ((1, 2), ("dp", "cp"), "context"), ((2,), None, "context"),
              ((2,), ("cp",), "sequence"), ((1, 2), ("dp", "cp"), "hidden"), ((2,), ("tp",), "context"),
              ((1, 2), ("dp", "tp"), "context"), ((1, 2), ("dp", "x"), "context")]


def _axis_names() -> list[Any]:
    """Each of ``AXIS_NAMES`` parallelised: the plan's layout and degree, or the refusal's location, message and
    hint."""
    from torch.distributed.device_mesh import init_device_mesh
    out: list[Any] = []
    for shape, names, layout in AXIS_NAMES:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        m = blockir.compile(LLAMA, "LlamaModel", seed=0)
        try:
            blockir.parallelize(m, mesh, LLAMA, "LlamaModel", layout=layout, dims={"B": 2, "S": 4})
        except blockir.BlockError as exc:
            (d,) = exc.diagnostics
            out.append((d.code, str(d.span), d.message, d.hint))
        else:
            out.append((m.blockir_plan.layout, m.blockir_plan.world))
    return out


@pytest.fixture(scope="module")
def dp_world() -> dict[str, Any]:
    return run_world(_body, 2)


def test_on_a_real_dp_tp_mesh_a_failed_forward_leaves_no_slice_and_a_second_parallelize_is_refused(
        dp_world: dict[str, Any]) -> None:
    results = {k: v for k, v in dp_world.items() if k not in ("fused rules", "axis names", "sources")}
    assert results == {
        "failed": "input 'x' of LlamaModel: axis D has size 32, but the module was compiled with D = 64",
        "slice": (0, 1), "same masks": True,
        "twice": ("E0722", "the module is already parallelised (replicated layout over 1 rank)"),
        "fused units": ["", "layers.0.input_layernorm", "layers.0.self_attn", "layers.0.mlp", "layers.1.self_attn",
                        "layers.1.mlp"]}


def test_a_context_parallel_axis_is_named_cp_and_a_tensor_parallel_one_tp(dp_world: dict[str, Any]) -> None:
    where = "blockir.parallelize(mesh=…)"
    assert dp_world["axis names"] == [
        ("context", 2), ("context", 2), ("context", 2),
        ("E0722", where, "the sequence layout splits heads and hidden units over a tensor-parallel axis named 'tp', "
         "but the mesh's last axis is 'cp', the context layout's",
         "name it 'tp' (mesh_dim_names=('tp',)), or pass layout='context'"),
        ("E0722", where, "the hidden layout splits heads and hidden units over a tensor-parallel axis named 'tp', "
         "but the mesh's last axis is 'cp', the context layout's",
         "name it 'tp' (mesh_dim_names=('dp', 'tp')), or pass layout='context'"),
        ("E0722", where, "the context layout splits the sequence's rows over a context-parallel axis named 'cp', "
         "but the mesh's last axis is 'tp', the other layouts'",
         "name it 'cp' (mesh_dim_names=('cp',)), or pass a tensor-parallel layout (replicated, sequence, hidden)"),
        ("E0722", where, "the context layout splits the sequence's rows over a context-parallel axis named 'cp', "
         "but the mesh's last axis is 'tp', the other layouts'",
         "name it 'cp' (mesh_dim_names=('dp', 'cp')), or pass a tensor-parallel layout (replicated, sequence, hidden)"),
        ("E0722", where, "a 2-D mesh must name its axes ('dp', 'cp'), not ('dp', 'x')",
         "init_device_mesh(device, (dp, cp), mesh_dim_names=('dp', 'cp'))")]


def test_the_fused_ops_split_rows_over_ranks_and_sum_parameter_gradients(dp_world: dict[str, Any]) -> None:
    """normalized, residual_out and the stream's gradients keep the stream's split; the weight and bias
    gradients are pending sums over the ranks; all equal the plain tensors' within rounding."""
    for key, (placements, error) in dp_world["fused rules"].items():
        axis = key[-2]
        params = ["P(sum)"] * (2 if key.startswith("layer") else 1)
        assert placements == [f"S({axis})"] * 4 + params, key
        assert error <= 1e-6, (key, error)


def test_the_parameters_values_come_from_the_source_rank_or_from_each_rank(dp_world: dict[str, Any]) -> None:
    """Ranks holding different weights end with rank 0's by default, rank 1's from rank 1, their own with
    None (on both ranks: 2), and a source that is not a rank of the axis is refused before anything changes."""
    sources = dp_world["sources"]
    assert {k: sources[k] for k in ("0", "1", "None")} == {"0": 2, "1": 2, "None": 2}
    hint = "0 (the default) sends rank 0's values; None keeps each rank's own"
    for source in ("2", "'0'", "True"):
        assert sources[source] == ("E0722", "blockir.parallelize(src_data_rank=…)", "src_data_rank must be a rank of "
                                   f"the 2-rank axis the plan runs over, or None, got {source}", hint)
