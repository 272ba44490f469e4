"""Context parallelism: the sequence stays split through attention, each rank attending from its own rows.

Every rank holds all the weights and the rows r·S/P … (r+1)·S/P - 1 of the stream (``Shard(1)``). Norms,
residual adds, MLPs and dropout act on each row alone, so DTensor runs them on the rank's rows without a
collective, and every parameter's gradient is a pending sum over the ranks (``Partial``), each having seen
only its tokens. Attention is the one place a row reads others: each rank projects q, k and v of its rows,
rotates them at their global positions, all-gathers k and v along the sequence (an autograd-aware
``redistribute`` from ``Shard`` to ``Replicate``, whose backward reduce-scatters the keys' gradients) and
attends from its queries to every key, its causal mask, window and 4-D masks offset by its first position.

PyTorch's ``context_parallel`` (ring attention) replaces only the CUDA flash, efficient and cuDNN kernels
of ``scaled_dot_product_attention``, for causal or unmasked attention; on CPU, and for the masks, windows
and biases blockir's attention builds, the all-gather is the path taken.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle

from blockir.diagnostics import BlockError, error
from blockir.lower.distributed.placing import place, source_of
from blockir.lower.layers.numerics import sequence_order
from blockir.lower.layers.query_rows import QueryRows
from blockir.lower.layers.zigzag import zigzag_order, zigzag_runs


class ContextRows(QueryRows):
    """A rank's slice of the rows: q, k and v of its tokens ``[B, H, S/P, hd]``, the keys of all of them.

    ``balanced``: the stream is in zig-zag order (``blockir.lower.layers.zigzag``), the rank's rows being
    chunks r and 2P - 1 - r of 2P; the gathered keys are put back in the sequence's order."""

    def __init__(self, mesh: DeviceMesh, balanced: bool = False) -> None:
        self.mesh, self.rank, self.world = mesh, mesh.get_local_rank(), mesh.size()
        self.chunks = 2 * self.world if balanced else self.world

    def local(self, t: Tensor) -> Tensor:
        # the projections of the rank's rows: the gradient of each is its own rows' (the default Shard)
        return t.to_local() if isinstance(t, DTensor) else t

    def keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every rank's keys and values along the sequence. Each rank's queries read all of them, so the
        gradient reaching the gathered keys is a pending sum, reduce-scattered back onto the owners' rows."""
        def gather(t: Tensor) -> Tensor:
            whole = DTensor.from_local(t, self.mesh, [Shard(2)], run_check=False).redistribute(self.mesh, [Replicate()])
            whole = whole.to_local(grad_placements=[Partial()])
            if self.chunks == self.world:
                return whole
            # zig-zag order back to the sequence's: stream position j holds sequence position order[j]
            order = zigzag_order(whole.shape[2], self.chunks, whole.device)
            return whole.index_select(2, torch.argsort(order))
        return gather(k), gather(v)

    def positions(self, ids: Tensor | None) -> Tensor | None:
        return None if ids is None else ids[:, self.held(ids.shape[1], ids.device)]

    def runs(self, held: int) -> list[tuple[int, int]]:
        """The rank's ``held`` rows as runs of the sequence's positions (first, count), in the order held."""
        if self.chunks == self.world:
            return [(self.rank * held, held)]
        return zigzag_runs(self.rank * held, held, self.world * held, self.chunks)

    def span(self, seq: Any) -> tuple[Any, int | Tensor | None]:
        rows = seq // self.world
        if self.chunks == self.world:
            return rows, self.rank * rows
        return rows, self.held(seq, torch.device("cpu"))

    def held(self, seq: int, device: torch.device) -> slice | Tensor:
        """The rank's rows of a sequence of ``seq``: one slice, or (load-balanced) each row's position."""
        runs = self.runs(seq // self.world)
        if len(runs) == 1:
            return slice(runs[0][0], runs[0][0] + runs[0][1])
        return torch.cat([torch.arange(first, first + n, device=device) for first, n in runs])

    def queries(self, held: int) -> tuple[list[tuple[int, int]], int]:
        # rank r holds queries r·S/P … (r+1)·S/P - 1 of S (or its two chunks): its dropout draws the one-process
        # decisions there
        return self.runs(held), self.world * held

    def stream(self, y: Any) -> Any:
        """The attended rows ``[B, S/P, H, hd]`` back in the stream's form, so the output projection's
        replicated weights meet them as the stream's rows."""
        return DTensor.from_local(y, self.mesh, [Shard(1)], run_check=False)


class ContextAttention(ParallelStyle):
    """A self-attention run on the rank's rows: its weights replicated, its caller's rotary tables and 4-D
    masks cut to those rows, the call's position ids (created when none are given) passed whole, so that a
    scaling read from the longest position (dynamic, LongRoPE) sees the whole call's, a KV cache refused.
    ``balanced``: the rows are the rank's two zig-zag chunks."""

    def __init__(self, balanced: bool = False) -> None:
        super().__init__()
        self.balanced = balanced

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for owner in module.modules():
            for name, p in list(owner.named_parameters(recurse=False)):
                if not isinstance(p.data, DTensor):
                    place(owner, name, device_mesh, [Replicate()], source_of(self))
        rows = ContextRows(device_mesh, self.balanced)
        vars(module)["query_rows"] = rows

        def prepare(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            if kwargs.get("past_key_values") is not None:
                raise BlockError([error(
                    "E0633", f"{vars(m)['name']} runs context-parallel: each rank holds a slice "
                    "of the sequence's rows, and a KV cache holds the keys of one process's whole sequence",
                    vars(m)["span"], hint="generate with the module on one process (blockir.compile), or "
                    "parallelise it with another layout")])
            seq = args[0].shape[1]
            own = rows.held(seq, args[0].device)
            if kwargs.get("position_ids") is None:  # the call's, which the attention cuts to its rows (positions)
                kwargs["position_ids"] = torch.arange(seq, device=args[0].device)[None]
            tables = kwargs.get("position_embeddings")
            if tables is not None:
                kwargs["position_embeddings"] = tuple(t[:, own] for t in tables)
            mask = kwargs.get("attention_mask")
            if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[2] == seq:
                kwargs["attention_mask"] = mask[:, :, own]
            return args, kwargs

        module.register_forward_pre_hook(prepare, with_kwargs=True)
        return module


def balance_rows(module: nn.Module, paths: dict[str, list[str]], axis: int, chunks: int) -> None:
    """Load balancing: the stream holds the sequence's rows in zig-zag order between the places where full
    rows become the stream's (a stream-typed input, an embedding's output, an extern's output) and where the
    stream is gathered into full rows (the output, a head's input, an extern's input). Each place reorders
    the full tensor on its own side of the split or the gather, a local index on every rank: the collectives
    are the unbalanced layout's. ``paths``: "into" (outputs put in stream order), "back" (inputs put back in
    the sequence's order) and "root" ("input", "output": the module's own boundary, when stream-typed).
    While the module runs, dropout of the stream keys each row by its sequence position (``sequence_order``)."""
    def order(t: Tensor) -> Tensor:
        return zigzag_order(t.shape[axis], chunks, t.device)

    def into(t: Tensor) -> Tensor:
        return t.index_select(axis, order(t))

    def back(t: Tensor) -> Tensor:
        return t.index_select(axis, torch.argsort(order(t)))

    for path in paths["into"]:  # before the style's own hook splits the output into the stream
        module.get_submodule(path).register_forward_hook(lambda m, args, out: into(out), prepend=True)
    for path in paths["back"]:  # after the style's own hook gathers the input into full rows
        module.get_submodule(path).register_forward_pre_hook(lambda m, args: (back(args[0]), *args[1:]))
    if "input" in paths["root"]:
        module.register_forward_pre_hook(lambda m, args: (into(args[0]), *args[1:]), prepend=True)
    if "output" in paths["root"]:
        module.register_forward_hook(lambda m, args, out: back(out))
    forward = module.forward

    def ordered(*args: object, **kwargs: object) -> object:
        with sequence_order(axis, chunks):
            return forward(*args, **kwargs)

    module.forward = ordered  # type: ignore[method-assign]
