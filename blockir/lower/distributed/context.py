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
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from blockir.diagnostics import BlockError, error
from blockir.lower.layers.query_rows import QueryRows


class ContextRows(QueryRows):
    """A rank's slice of the rows: q, k and v of its tokens ``[B, H, S/P, hd]``, the keys of all of them."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh, self.rank, self.world = mesh, mesh.get_local_rank(), mesh.size()

    def local(self, t: Tensor) -> Tensor:
        # the projections of the rank's rows: the gradient of each is its own rows' (the default Shard)
        return t.to_local() if isinstance(t, DTensor) else t

    def keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Every rank's keys and values along the sequence. Each rank's queries read all of them, so the
        gradient reaching the gathered keys is a pending sum, reduce-scattered back onto the owners' rows."""
        def gather(t: Tensor) -> Tensor:
            whole = DTensor.from_local(t, self.mesh, [Shard(2)], run_check=False).redistribute(self.mesh, [Replicate()])
            return whole.to_local(grad_placements=[Partial()])
        return gather(k), gather(v)

    def span(self, seq: Any) -> tuple[Any, int | None]:
        rows = seq // self.world
        return rows, self.rank * rows

    def queries(self, held: int) -> tuple[int, int]:
        # rank r holds queries r·S/P … (r+1)·S/P - 1 of S: its dropout draws the one-process decisions there
        return self.rank * held, self.world * held

    def stream(self, y: Any) -> Any:
        """The attended rows ``[B, S/P, H, hd]`` back in the stream's form, so the output projection's
        replicated weights meet them as the stream's rows."""
        return DTensor.from_local(y, self.mesh, [Shard(1)], run_check=False)


class ContextAttention(ParallelStyle):
    """A self-attention run on the rank's rows: its weights replicated, its caller's positions and 4-D masks
    cut to those rows (position ids created when none are given), a KV cache refused."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for owner in module.modules():
            for name, p in list(owner.named_parameters(recurse=False)):
                if not isinstance(p.data, DTensor):
                    owner.register_parameter(name, nn.Parameter(distribute_tensor(p.data, device_mesh, [Replicate()]),
                                                                requires_grad=p.requires_grad))
        rows = ContextRows(device_mesh)
        vars(module)["query_rows"] = rows

        def prepare(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            if kwargs.get("past_key_values") is not None:
                raise BlockError([error(
                    "E0633", f"{vars(m)['name']} runs context-parallel: each rank holds a slice "
                    "of the sequence's rows, and a KV cache holds the keys of one process's whole sequence",
                    vars(m)["span"], hint="generate with the module on one process (blockir.compile), or "
                    "parallelise it with another layout")])
            seq = args[0].shape[1]
            count, first = rows.span(seq)
            own = slice(first, first + count)
            ids = kwargs.get("position_ids")
            kwargs["position_ids"] = torch.arange(first, first + count, device=args[0].device)[None] \
                if ids is None else ids[:, own]
            tables = kwargs.get("position_embeddings")
            if tables is not None:
                kwargs["position_embeddings"] = tuple(t[:, own] for t in tables)
            mask = kwargs.get("attention_mask")
            if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[2] == seq:
                kwargs["attention_mask"] = mask[:, :, own]
            return args, kwargs

        module.register_forward_pre_hook(prepare, with_kwargs=True)
        return module
