"""Apply a derived tensor-parallel plan to a compiled module with ``parallelize_module``, and FSDP2 over ``dp``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput, PrepareModuleOutput, parallelize_module
from torch.distributed.tensor.placement_types import Placement, _StridedShard

from blockir.analyses.parallel import COLUMN, LAYOUTS, ParallelPlan, derive_plan, stream_ends, stream_type
from blockir.analyses.sizes import Sizes
from blockir.api import load
from blockir.lower.distributed import fused_sharding  # noqa: F401  (the fused ops' DTensor rules)
from blockir.lower.distributed.context import balance_rows
from blockir.lower.distributed.head_pieces import local_heads
from blockir.lower.distributed.placing import CHOOSES_SOURCE, Source, place, placed
from blockir.lower.distributed.styles import STYLES, Site
from blockir.lower.distributed.vocab import shard_tables
from blockir.lower.fx.module import CONTRACT_ATTR, BlockModule
from blockir.lower.layers.fixup_bias import ACT, OUT
from blockir.lower.layers.numerics import batch_slice
from blockir.diagnostics import BlockError, argument_error
from blockir.ir.program import Block, Program
from blockir.signatures import public


def _bad(argument: str, message: str, hint: str | None = None) -> BlockError:
    return BlockError([argument_error("parallelize", argument, message, hint)])


def _stream(block: Block, program: Program, layout: str) -> Placement:
    """The stream's placement as DTensor states it: the tensor dim of S (sequence, context) or of D (hidden).

    ``derive_plan`` has checked that the stream has the axis the layout splits."""
    if layout == "replicated":
        return Replicate()
    role = "model" if layout == "hidden" else "seq"
    return Shard(next(i for i, a in enumerate(stream_type(program, block).axes) if a.role.value == role))


def _boundary(module: nn.Module, mesh: DeviceMesh, program: Program, block: Block, stream: Placement) -> None:
    """The module takes and returns full tensors: a stream-typed input is sliced to the stream's layout and a
    stream-typed result gathered; token ids and logits are full tensors already (see the embedding and head),
    but for logits a vocab-parallel head leaves split by vocabulary."""
    takes, returns = stream_ends(program, block)
    if takes:
        parallelize_module(module, mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(stream,), use_local_output=False))
    if returns:
        parallelize_module(module, mesh, PrepareModuleOutput(
            output_layouts=(stream,), desired_output_layouts=(Replicate(),), use_local_output=True))


def _share_kv(module: nn.Module, plan: ParallelPlan, world: int) -> None:
    """A branch whose key/value heads are replicated holds one per rank: its query groups shrink to match."""
    for m in plan.modules:
        if m.style == "kv_replicated":
            module.get_submodule(m.path.rpartition(".")[0]).kv_heads = world


def _head_spans(module: nn.Module, plan: ParallelPlan, rank: int, world: int) -> None:
    """Each attention branch computes a contiguous block of its query heads: it learns which of all they are."""
    for m in plan.modules:
        if m.style == "branch" and m.kind.endswith("attention"):
            branch = module.get_submodule(m.path)
            vars(branch).update(head_span=(rank * branch.heads // world, branch.heads))


def _head_shards(module: nn.Module, plan: ParallelPlan, rank: int, world: int) -> None:
    """Each attention branch learns which of its query heads this rank holds, so that dropout on its
    probabilities draws the unsharded run's decisions for those heads (``attention_core.drop_probs``)."""
    for m in plan.modules:
        if m.style == "branch" and "q" in COLUMN.get(m.kind, ()):
            vars(module.get_submodule(m.path))["head_shard"] = (rank, world)


def _styles(plan: ParallelPlan, stream: Placement, module: nn.Module, mesh: DeviceMesh,
            data_parallel: bool) -> dict[str, ParallelStyle]:
    """The style of every submodule the plan places that needs one (``styles.STYLES``)."""
    out: dict[str, ParallelStyle] = {}
    for entry in plan.modules:
        make = STYLES.get(entry.style)
        style = make(Site(entry, module, mesh, stream, plan, data_parallel)) if make is not None else None
        if style is not None:
            out[entry.path] = style
    return out


def _head_params(module: nn.Module, mesh: DeviceMesh, plan: ParallelPlan, source: Source) -> None:
    """Per-head parameters of attention branches, in every layout: a per-head q/k norm's gain is replicated (each
    rank applies it to its own heads, so its gradient is a pending sum), as is a key norm's over replicated
    key/value heads (each rank applies its head's slice); a q/k norm's over the whole width, nGPT's s_qk and
    NormFormer's head scales are split with the query heads."""
    placed = {m.path: [Shard(0) if m.style == "width_norm" else Replicate()] for m in plan.modules
              if m.style in ("head_norm", "width_norm", "kv_width_norm")}
    placed |= {key.rpartition(".")[0]: [Shard(0)] for key in plan.params if key.endswith((".qk_scale", ".head_scale"))}
    for path, placements in placed.items():
        for name, p in list(module.get_submodule(path).named_parameters(recurse=False)):
            if name in ("weight", "bias", "qk_scale", "head_scale") and not isinstance(p.data, DTensor):
                place(module.get_submodule(path), name, mesh, placements, source)
    # Fixup's scalar biases inside a branch: replicated, each rank adding them to its own heads or units
    for key in plan.params:
        path, _, name = key.rpartition(".")
        if name in (ACT, OUT):
            owner = module.get_submodule(path)
            if not isinstance(owner.get_parameter(name).data, DTensor):
                place(owner, name, mesh, [Replicate()], source)


def _replicate_rest(module: nn.Module, mesh: DeviceMesh, styled: set[str], source: Source) -> None:
    """Parameters no style owns become replicated DTensors, so they meet DTensor activations; a parameter
    held under several names (a tied table) stays one parameter."""
    replaced: dict[int, nn.Parameter] = {}
    for name, param in list(module.named_parameters(remove_duplicate=False)):
        if isinstance(param.data, DTensor) and id(param) not in replaced:
            continue
        owner, _, leaf = name.rpartition(".")
        if any(owner == s or owner.startswith(s + ".") for s in styled):
            continue
        if id(param) not in replaced:
            replaced[id(param)] = placed(param.data, mesh, [Replicate()], source, param.requires_grad)
        (module.get_submodule(owner) if owner else module).register_parameter(leaf, replaced[id(param)])


# the data-parallel axes a mesh may name before its tensor-parallel one: FSDP2, or HSDP (replicated groups of shards)
DATA_AXES = {2: ("dp",), 3: ("dp_replicate", "dp_shard")}


def _fully_shard(module: nn.Module, mesh: DeviceMesh, plan: ParallelPlan, mp_policy: Any) -> None:
    """FSDP2 over the data-parallel mesh (2-D: HSDP, replicated over the first axis and sharded over the
    second): each stacked layer is one unit, the root holds the rest."""
    from torch.distributed.fsdp import fully_shard
    options: dict[str, Any] = {"shard_placement_fn": data_shard}
    if mp_policy is not None:
        options["mp_policy"] = mp_policy
    for path in _units(module, plan):
        fully_shard(module.get_submodule(path), mesh=mesh, **options)
    fully_shard(module, mesh=mesh, **options)


def data_shard(param: nn.Parameter) -> Shard | None:
    """The dim FSDP2 shards ``param`` along over the data axes: the next one where its tensor-parallel placement
    is a strided shard of dim 0 (a stacked gate/up matrix split within its blocks), since FSDP2 would compose
    its own shard of that dim with the strided one as if that were a plain shard (torch 2.13) and gather a
    wrong tensor; else FSDP2's default, dim 0."""
    placements = param.placements if isinstance(param, DTensor) else ()
    if param.dim() > 1 and any(isinstance(p, _StridedShard) and p.dim == 0 for p in placements):
        return Shard(1)
    return None


def _units(module: nn.Module, plan: ParallelPlan) -> list[str]:
    """The FSDP2 units below the root: each stacked layer, since FSDP2 gathers a unit's parameters when the
    unit's module runs. Where the fused backend inlined a stack's layers into the root graph so that the
    boundaries between them fuse, a layer never runs as a module: each module of it the graph calls (its
    branches, an unfused norm) is a unit instead, and what the graph reads as an attribute (the norms of the
    fused boundaries) stays with the root, gathered for the root's forward and backward."""
    called = [str(node.target) for node in module.graph.nodes if node.op == "call_module"]  # type: ignore[union-attr]
    units: list[str] = []
    for path in plan.layers:
        inlined = [target for target in called if target.startswith(path + ".")]
        units += list(dict.fromkeys(inlined)) or [path]
    return units


def data_rank(dp: DeviceMesh) -> tuple[int, int]:
    """This rank's index among the data-parallel ranks and their number: over a replicate × shard mesh the
    ranks of a replica group come first, so each holds the batch slice in that order."""
    index = 0
    for dim in range(dp.ndim):
        index = index * dp.size(dim) + dp.get_local_rank(dim)
    return index, dp.size()


def _batch_slice(module: nn.Module, index: int, count: int) -> None:
    """While the module runs, dropout masks are keyed by global batch rows: this rank's slice is offset by
    its data-parallel index, so the ranks together draw the masks of one process on the whole batch.

    The forward runs inside ``batch_slice``, which restores the slice however the forward ends: a call that
    raises leaves every later module of the process drawing its own masks."""
    forward = type(module).forward

    def sliced(*args: object, **kwargs: object) -> object:
        with batch_slice(index, count):
            return forward(module, *args, **kwargs)

    module.forward = sliced  # type: ignore[method-assign]


def _check_arguments(module: object, mesh: object, program: object, name: object, layout: object,
                     mp_policy: object, vocab: object, load_balance: object = False) -> Program:
    """Refuse, before anything is changed, a call that cannot parallelise ``module``; the program, loaded."""
    if not isinstance(module, BlockModule) or CONTRACT_ATTR not in vars(module):
        raise _bad("module", f"parallelize expects a module returned by blockir.compile, got {type(module).__name__}",
                   "m = blockir.compile(program, name); blockir.parallelize(m, mesh, program, name)")
    plan = getattr(module, "blockir_plan", None)
    if plan is not None:
        raise _bad("module", f"the module is already parallelised ({plan.layout} layout over {plan.world} "
                   f"rank{'s' if plan.world != 1 else ''})",
                   "compile a fresh module to parallelise it another way")
    if isinstance(program, (str, Path)):
        program = load(program)
    elif not isinstance(program, Program):
        raise _bad("program", f"expected a Program or a path, got {type(program).__name__}",
                   "the program the module was compiled from")
    if not isinstance(name, str) or name not in program.block_map:
        raise _bad("name", f"no block named {name!r}", "blocks: " + ", ".join(program.block_map))
    if module.blockir_block != name:
        raise _bad("name", f"the module was compiled from block '{module.blockir_block}', not '{name}'",
                   f"parallelize(m, mesh, program, '{module.blockir_block}')")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise _bad("layout", f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if not isinstance(vocab, bool):
        raise _bad("vocab", f"vocab must be True or False, got {vocab!r}")
    if not isinstance(load_balance, bool):
        raise _bad("load_balance", f"load_balance must be True or False, got {load_balance!r}")
    if load_balance and layout != "context":
        raise _bad("load_balance", f"load balancing orders the rows of the context layout, not the {layout} layout's",
                   "pass layout='context', or leave load_balance out")
    if load_balance and vocab:
        raise _bad("load_balance", "load balancing reorders the rows the head reads, which a vocabulary-parallel "
                   "head leaves split", "leave vocab or load_balance out")
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if mp_policy is not None and not isinstance(mp_policy, MixedPrecisionPolicy):
        raise _bad("mp_policy", f"expected a torch.distributed.fsdp.MixedPrecisionPolicy, got {type(mp_policy).__name__}",
                   "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)")
    if not isinstance(mesh, DeviceMesh) or mesh.ndim not in (1, 2, 3):
        raise _bad("mesh", "mesh must be a 1-D DeviceMesh (tensor or context parallel), a 2-D one named ('dp', 'tp') "
                   "or a 3-D one named ('dp_replicate', 'dp_shard', 'tp'), 'cp' for 'tp' under the context layout",
                   f"got {f'a {mesh.ndim}-D DeviceMesh' if isinstance(mesh, DeviceMesh) else type(mesh).__name__}")
    _check_axis(mesh, layout)
    if mp_policy is not None and mesh.ndim == 1:
        raise _bad("mp_policy", "mixed precision is FSDP2's: a 1-D mesh has no data-parallel axis to shard over",
                   "give a ('dp', 'tp') mesh, or leave mp_policy out")
    return program


def _check_source(source: object, mesh: DeviceMesh) -> None:
    if source is not None and (not isinstance(source, int) or isinstance(source, bool)
                               or not 0 <= source < mesh.size()):
        raise _bad("src_data_rank", f"src_data_rank must be a rank of the {mesh.size()}-rank axis the plan runs "
                   f"over, or None, got {source!r}", "0 (the default) sends rank 0's values; None keeps each rank's own")
    if source != 0 and not CHOOSES_SOURCE:
        raise _bad("src_data_rank", f"torch {torch.__version__} always sends rank 0's values (distribute_tensor takes "
                   "no src_data_rank)", "leave src_data_rank out, or upgrade torch")


def _balance(module: nn.Module, plan: ParallelPlan, program: Program, block: Block, axis: int, chunks: int) -> None:
    """The zig-zag order's reorderings at the places ``_styles`` and ``_boundary`` split full rows into the
    stream or gather them (``context.balance_rows``)."""
    state = stream_type(program, block)
    paths = {"into": [m.path for m in plan.modules if m.style in ("embedding", "extern")],
             "back": [m.path for m in plan.modules if m.style in ("head", "extern")],
             "root": [side for side, t in (("input", block.params[0].type if block.params else None),
                                           ("output", block.result)) if t is not None and t.names == state.names]}
    balance_rows(module, paths, axis, chunks)


def _check_axis(mesh: DeviceMesh, layout: str) -> None:
    """The mesh's names: data-parallel axes first (``DATA_AXES``), then the axis the plan runs over, ``cp`` under
    the context layout and ``tp`` under the others; a 1-D mesh may leave its axis unnamed."""
    names = mesh.mesh_dim_names
    axis = parallel_axis(layout)
    if names is not None and names[-1] in ("tp", "cp") and names[-1] != axis:
        what = "splits the sequence's rows over a context-parallel axis" if layout == "context" else \
            "splits heads and hidden units over a tensor-parallel axis"
        other = "the context layout's" if axis == "tp" else "the other layouts'"
        raise _bad("mesh", f"the {layout} layout {what} named '{axis}', but the mesh's last axis is "
                   f"'{names[-1]}', {other}",
                   f"name it '{axis}' (mesh_dim_names={(*names[:-1], axis)!r}), or pass " +
                   ("layout='context'" if names[-1] == "cp" else "a tensor-parallel layout (replicated, sequence, hidden)"))
    if mesh.ndim > 1 and names != (*DATA_AXES[mesh.ndim], axis):
        wanted = ", ".join(f"'{a}'" for a in (*DATA_AXES[mesh.ndim], axis))
        sizes = ", ".join(a for a in (*DATA_AXES[mesh.ndim], axis))
        raise _bad("mesh", f"a {mesh.ndim}-D mesh must name its axes ({wanted}), not {names}",
                   f"init_device_mesh(device, ({sizes}), mesh_dim_names=({wanted}))")


def parallel_axis(layout: str) -> str:
    """The name of the mesh axis a layout's plan runs over: ``cp`` for context parallelism, else ``tp``."""
    return "cp" if layout == "context" else "tp"


@public("parallelize")
def parallelize(module: nn.Module, mesh: DeviceMesh, program: Program | str | Path, name: str, *,
                layout: str = "sequence", dims: Mapping[str, int] | None = None, vocab: bool = False,
                mp_policy: Any = None, load_balance: bool = False, src_data_rank: int | None = 0) -> nn.Module:
    """Parallelise ``module`` (``blockir.compile(program, name, ...)``) over ``mesh`` in place.

    A 1-D ``mesh`` is the tensor-parallel axis (the context-parallel one under ``layout="context"``). A 2-D
    mesh must name its axes ``("dp", "tp")`` (``("dp", "cp")`` under the context layout, as the last axis of
    every mesh that names it: a ``cp`` axis under another layout, or a ``tp`` one under the context layout,
    is refused): the plan runs over ``tp`` (``cp``) and FSDP2 (``fully_shard``, per stacked layer and at the root) shards the
    parameters over ``dp``; each ``dp`` rank then feeds its own slice of the batch (equal, consecutive slices
    of axis 0, in ``dp`` rank order), gradients are averaged over ``dp``, and dropout masks are those of the
    whole batch on one process. A 3-D mesh named ``("dp_replicate", "dp_shard", "tp")`` shards the parameters
    over ``dp_shard`` and replicates those shards over ``dp_replicate`` (HSDP); the data-parallel ranks are
    numbered replica group first. ``mp_policy`` (FSDP2's ``MixedPrecisionPolicy``: the dtype parameters are
    computed in and the dtype gradients are reduced in) is handed to ``fully_shard``.

    ``layout`` is where the residual stream lives between blocks: ``replicated`` (Megatron tensor
    parallelism), ``sequence`` (rows split between ranks at norms and adds), ``hidden`` (features
    split) or ``context`` (context parallelism over the same axis: weights replicated, rows split
    everywhere, attention reading the keys and values of all ranks' rows). The module still takes and returns full tensors: its input is sliced to the stream's
    layout and its output gathered, so it is a drop-in replacement for the single-device module.
    ``dims`` must give the sizes the module was compiled with and the input's batch and sequence.

    ``load_balance=True`` (the context layout only) cuts the sequence into 2P equal chunks and gives rank r
    of P chunks r and 2P - 1 - r (zig-zag), so under a causal mask every rank's queries reach as many keys;
    the stream holds the rows in that order between the module's boundaries, and the masks, positions and
    dropout are the one-process ones.

    ``src_data_rank`` is where the parameters' values come from, as in torch's ``distribute_tensor``: rank 0
    of the plan's axis by default, whose values are sent to the others; ``None`` keeps each rank's own and
    sends nothing, for ranks that already hold the same weights (each loaded the same checkpoint, or compiled
    with the same ``seed``).

    ``vocab=True`` splits the token embedding and the head by vocabulary rows (a tied table once): the
    module then returns its logits as a ``Shard(-1)`` DTensor, never gathered, for a cross-entropy under
    ``loss_parallel`` (``blockir.lower.distributed.loss.cross_entropy``); ``.full_tensor()`` gathers them.
    """
    program = _check_arguments(module, mesh, program, name, layout, mp_policy, vocab, load_balance)
    block = program.block(name)
    dp, mesh = (mesh[DATA_AXES[mesh.ndim]], mesh[parallel_axis(layout)]) if mesh.ndim > 1 else (None, mesh)
    _check_source(src_data_rank, mesh)
    plan = derive_plan(program, block, Sizes.of(program, dims), layout, mesh.size(), vocab=vocab,
                       balanced=load_balance)
    stream = _stream(block, program, layout)
    shard_tables(module, [m.path for m in plan.modules if m.style in ("vocab_embedding", "vocab_head")], mesh,
                 src_data_rank)
    # a module's own style first, then its enclosing module's, which places only what is left (BERT's attention
    # holds its Post-LN norm: the norm's style places the norm's gain, the attention's context style the rest)
    styles = dict(sorted(_styles(plan, stream, module, mesh, dp is not None).items(), key=lambda s: -s[0].count(".")))
    if styles:  # torch hands the source to every style (``ParallelStyle.src_data_rank``), blockir's own included
        parallelize_module(module, mesh, styles, **({} if src_data_rank == 0 else {"src_data_rank": src_data_rank}))
    _head_spans(module, plan, mesh.get_local_rank(), mesh.size())
    local_heads(module, plan, mesh.size())
    _share_kv(module, plan, mesh.size())
    _head_shards(module, plan, mesh.get_local_rank(), mesh.size())
    if plan.layout != "context":  # under it every rank holds all heads, their parameters replicated
        _head_params(module, mesh, plan, src_data_rank)
    if not isinstance(stream, Replicate):
        _replicate_rest(module, mesh, {p for p, s in styles.items() if getattr(s, "owns_parameters", True)},
                        src_data_rank)
        _boundary(module, mesh, program, block, stream)
    if dp is not None:
        _fully_shard(module, dp, plan, mp_policy)
        _batch_slice(module, *data_rank(dp))
        # FSDP2 may compute in another dtype than it stores (mixed precision) and casts the inputs itself
        vars(module)[CONTRACT_ATTR] = vars(module)[CONTRACT_ATTR]._replace(dtype=None, probe=None)
    if plan.balanced:
        _balance(module, plan, program, block, stream.dim, 2 * mesh.size())  # type: ignore[attr-defined]
    module.blockir_plan = plan
    return module
