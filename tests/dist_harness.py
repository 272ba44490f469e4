"""Spawn gloo process groups on the loopback interface and compare a parallelised module with one process."""
from __future__ import annotations

import tempfile
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


def _run(program: str, name: str, dims: dict[str, int], layout: str, shape: tuple[int, ...],
         mode: str) -> dict[str, Any]:
    import blockir
    m = blockir.compile(program, name, dims=dims, seed=0)
    m.train(mode == "train")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), requires_grad=True)
    grad_out = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    if layout is not None:
        from torch.distributed.device_mesh import init_device_mesh
        from blockir.backends.distributed import parallelize
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
        parallelize(m, mesh, program, name, layout=layout, dims=dims)
    seen: dict[str, str] = {}

    def record(path: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            seen.setdefault(path, _placements(args[0]))
        return hook

    hooks = [sub.register_forward_pre_hook(record(path)) for path, sub in m.named_modules()
             if path.count(".") <= 1 and path]
    y = m(x)
    y.backward(grad_out)
    for h in hooks:
        h.remove()
    return dict(y=y.detach(), dx=x.grad.detach(),
                grads={k: _full(p.grad).detach().clone() for k, p in m.named_parameters()},
                params={k: _placements(p) for k, p in m.named_parameters()}, inputs=seen)


def _worker(rank: int, world: int, store: str, out: str, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for when several test runs share the machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = _run(*args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def compare(program: str, name: str, dims: dict[str, int], layout: str, shape: tuple[int, ...],
            world: int = 2, mode: str = "eval") -> tuple[Any, Any]:
    """(reference, parallel) runs: output ``y``, input gradient ``dx``, parameter gradients ``grads`` (gathered),
    the placement of each parameter (``params``) and of the first input of each top-level submodule (``inputs``)."""
    ref = _run(program, name, dims, None, shape, mode)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "result.pt")
        mp.spawn(_worker, args=(world, str(Path(d) / "store"), out, (program, name, dims, layout, shape, mode)),
                 nprocs=world, join=True)
        par = torch.load(out)
    return ref, par
