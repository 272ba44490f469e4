"""Spawn gloo process groups on the loopback interface and compare a parallelised module with one process."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def _placements(t: Any) -> str:
    from torch.distributed.tensor import DTensor
    return ",".join(map(str, t.placements)) if isinstance(t, DTensor) else "local"


def _gather_batch(t: torch.Tensor, group: Any) -> torch.Tensor:
    """The full batch from each data-parallel rank's slice, in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts)


def _run(program: str, name: str, dims: dict[str, int], layout: str | None, shape: tuple[int, ...],
         mode: str, dp: int = 1, backend: str = "fx") -> dict[str, Any]:
    import blockir
    m = blockir.compile(program, name, dims=dims, seed=0, backend=backend)
    m.train(mode == "train")
    tokens = len(shape) == 2  # [B, S] token ids of a language model, else a [B, S, D] stream
    x = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(1)) if tokens else \
        torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    group, rows, index = None, shape[0], 0
    if layout is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from blockir.lower.distributed import parallelize
        world = dist.get_world_size()
        if dp == 1:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        else:
            mesh = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
            group = mesh["dp"].get_group()
            # each data-parallel rank takes its slice of the batch; FSDP averages gradients over dp, so the
            # slice's output gradient is scaled by dp to sum them as the full-batch run does
            rows, index = shape[0] // dp, mesh["dp"].get_local_rank()
            x = x[index * rows:(index + 1) * rows]
        parallelize(m, mesh, program, name, layout=layout, dims=dims)
    x = x.clone().requires_grad_(not tokens)
    seen: dict[str, str] = {}

    def record(path: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            seen.setdefault(path, _placements(args[0]))
        return hook

    hooks = [sub.register_forward_pre_hook(record(path)) for path, sub in m.named_modules()
             if path.count(".") <= 1 and path]
    # the forward draws its one dropout seed from torch's generator: every rank and the reference draw the same
    torch.manual_seed(3)
    comms, planned = {}, {}
    if layout is not None and dp == 1:
        from collections import Counter
        from blockir.lower.distributed.comms import LayerCollectives
        with LayerCollectives(m, m.blockir_plan.layers, dist.get_world_size()) as counter:
            y = m(x)
        comms = counter.seen
        planned = {layer: Counter((c.op, c.elements) for c in cs) for layer, cs in m.blockir_plan.collectives.items()
                   if layer in comms}
    else:
        y = m(x)
    # the output gradient of the whole batch; a data-parallel rank takes its rows, scaled by dp (FSDP averages)
    grad_out = torch.randn(shape[0], *y.shape[1:], generator=torch.Generator().manual_seed(2))
    y.backward(grad_out[index * rows:(index + 1) * rows] * dp)
    for h in hooks:
        h.remove()
    y, dx = y.detach(), None if tokens else x.grad.detach()
    if group is not None:
        y, dx = _gather_batch(y, group), None if tokens else _gather_batch(dx, group) / dp
    return dict(y=y, dx=dx,
                grads={k: _full(p.grad).detach().clone() for k, p in m.named_parameters()},
                params={k: _placements(p) for k, p in m.named_parameters()}, inputs=seen, comms=comms, planned=planned)


TIMEOUT = 300  # seconds for one spawned world: a hung rendezvous fails its tests instead of hanging the suite
VOCAB = 50  # token ids are drawn below this: every vocabulary of the tests' models is larger
# program, block, dims, layout, shape, mode, dp, and optionally the compile backend (fx when absent)
Case = tuple[Any, ...]


def _worker(rank: int, world: int, store: str, out: str, cases: list[Case]) -> None:
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for when several test runs share the machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        results = [_run(*case) for case in cases]
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()
    # gloo can leave a joinable thread behind that aborts the interpreter's teardown (std::terminate, SIGABRT)
    # after a good run; the result is on disk and nothing else needs tearing down, so skip that teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def compare(cases: list[Case], world: int) -> list[tuple[Any, Any]]:
    """(reference, parallel) for each case, all parallel runs in one process group of ``world`` ranks.

    A case runs on a ``(dp, world // dp)`` mesh when ``dp`` > 1, else on one ``tp`` axis of all ranks; a
    ``[B, S]`` shape feeds token ids (``dx`` is then None), a ``[B, S, D]`` one a random stream; an eighth
    entry compiles both modules with that backend instead of fx. Each
    result holds the output ``y``, input gradient ``dx`` (both gathered over dp), parameter gradients
    ``grads`` (gathered), the placement of each parameter (``params``) and of the first input of each
    top-level submodule (``inputs``); on a 1-D mesh also the forward collectives each stacked layer issued
    (``comms``) and those the plan predicts for it (``planned``), as (kind, payload elements) counts. One spawn for many cases: starting ranks costs more than running them.
    """
    refs = [_run(program, name, dims, None, shape, mode, 1, *backend) for program, name, dims, _, shape, mode, _, *backend
            in cases]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "result.pt")
        ranks = mp.spawn(_worker, args=(world, str(Path(d) / "store"), out, cases), nprocs=world, join=False)
        deadline = time.monotonic() + TIMEOUT
        while not ranks.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in ranks.processes:
                    p.kill()
                raise TimeoutError(f"the {world}-rank world did not finish within {TIMEOUT} s")
        pars = torch.load(out)
    return list(zip(refs, pars))
