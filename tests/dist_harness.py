"""Spawn gloo process groups on the loopback interface and compare a parallelised module with one process."""
from __future__ import annotations

import contextlib
import faulthandler
import functools
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    if not isinstance(t, DTensor):
        return t
    # a replicated tensor is whole on every rank already (its gather would still dispatch, for nothing)
    return t.to_local() if all(p.is_replicate() for p in t.placements) else t.full_tensor()


def _whole(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each tensor whole, as ``full_tensor`` makes it. The shards and pending sums of tensors over a 1-D mesh
    travel in one gather of them all, as a gather or reduction per tensor (a round of messages between the ranks
    each) made most of a case's gathering time; every other DTensor (a larger mesh's) gathers itself."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Partial, Shard, _StridedShard
    out, split = {}, {}
    for key, t in tensors.items():
        if isinstance(t, DTensor) and t.device_mesh.ndim == 1 and \
                isinstance(t.placements[0], (Shard, _StridedShard, Partial)):
            split.setdefault(t.device_mesh.get_group(), []).append(key)
        else:
            out[key] = _full(t).detach().clone()
    for group, keys in split.items():
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, [tensors[key].to_local().detach() for key in keys], group=group)
        for i, key in enumerate(keys):
            out[key] = _assembled([part[i] for part in parts], tensors[key].placements[0])
    return {key: out[key] for key in tensors}


def _assembled(shards: list[torch.Tensor], placement: Any) -> torch.Tensor:
    """The whole tensor from every rank's shard, in rank order: ``Shard(d)`` chunks laid end to end along d;
    ``_StridedShard(d, n)`` holds the rank's chunk of each of n equal blocks along d, so block by block; a pending
    sum (``Partial``) adds the ranks' terms."""
    from torch.distributed.tensor.placement_types import Partial, _StridedShard
    if isinstance(placement, Partial):
        assert placement.reduce_op == "sum", placement
        return torch.stack(shards).sum(0)
    if not isinstance(placement, _StridedShard):
        return torch.cat(shards, placement.dim)
    pieces = [shard.tensor_split(placement.split_factor, placement.dim) for shard in shards]
    return torch.cat([piece[b] for b in range(placement.split_factor) for piece in pieces], placement.dim)


def _placements(t: Any) -> str:
    from torch.distributed.tensor import DTensor
    return ",".join(map(str, t.placements)) if isinstance(t, DTensor) else "local"


def _gather_batch(t: torch.Tensor, group: Any) -> torch.Tensor:
    """The full batch from each data-parallel rank's slice, in rank order."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts)


def data_ranks(dp: int | tuple[int, ...]) -> int:
    """How many data-parallel ranks a case's ``dp`` means: a number, or (replicate, shard) of an HSDP mesh."""
    return math.prod(dp) if isinstance(dp, tuple) else dp


def _mesh(dp: int | tuple[int, ...], layout: str) -> tuple[Any, Any]:
    """The case's mesh and the process group of this rank's data-parallel peers. The axis the plan runs over is
    named as the layout wants it: ``cp`` for the context layout, else ``tp``."""
    from blockir.lower.distributed.tp import parallel_axis
    return _named_mesh(dp, parallel_axis(layout))


@functools.cache
def _named_mesh(dp: int | tuple[int, ...], axis: str) -> tuple[Any, Any]:
    """Made once per world, data-parallel shape and axis name: every mesh is process groups of its own, each
    with its threads and sockets, which would pile up over the hundreds of cases a world runs."""
    from torch.distributed.device_mesh import init_device_mesh
    from blockir.lower.distributed.tp import DATA_AXES
    world = dist.get_world_size()
    if dp == 1:
        return init_device_mesh("cpu", (world,), mesh_dim_names=(axis,)), None
    sizes = dp if isinstance(dp, tuple) else (dp,)
    axes = DATA_AXES[len(sizes) + 1]
    mesh = init_device_mesh("cpu", (*sizes, world // data_ranks(dp)), mesh_dim_names=(*axes, axis))
    if len(axes) == 1:
        return mesh, mesh["dp"].get_group()
    # the data-parallel peers of each tensor- or context-parallel rank, numbered replica group first (as
    # parallelize does)
    groups = [dist.new_group(mesh.mesh[..., t].flatten().tolist()) for t in range(mesh.size(len(axes)))]
    return mesh, groups[mesh[axis].get_local_rank()]


def _run(program: str, name: str, dims: dict[str, int], layout: str | None, shape: tuple[int, ...],
         mode: str, dp: int | tuple[int, ...] = 1, vocab: bool = False,
         backend: str = "fx", load_balance: bool = False, source: int | None = 0) -> dict[str, Any]:
    import blockir
    from blockir.lifecycle.lm import Layout
    from blockir.lifecycle.token_lm import TokenLM
    m = blockir.compile(program, name, dims=dims, seed=0, backend=backend)
    # the one-process module's weights as compiled, for a comparison with the model they were imported from
    state = {k: v.detach().clone() for k, v in m.state_dict().items()} if layout is None else None
    steps = mode == "steps"
    m.train(mode == "train" or steps)
    tokens = len(shape) == 2  # [B, S] token ids of a language model, else a [B, S, D] stream
    x = torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(1)) if tokens else \
        torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    # a vocab case trains on windows: the model reads S ids and is scored on the next id at every position
    window = torch.cat([x, torch.randint(0, VOCAB, (shape[0], 1), generator=torch.Generator().manual_seed(4))], 1) \
        if vocab else None
    group, rows, index = None, shape[0], 0
    n = data_ranks(dp)
    if layout is not None:
        from blockir.lower.distributed import parallelize
        from blockir.lower.distributed.tp import DATA_AXES, data_rank
        (mesh, group), options = _mesh(dp, layout), {}
        if group is not None:
            # each data-parallel rank takes its slice of the batch; FSDP averages gradients over dp, so the
            # slice's output gradient is scaled by dp to sum them as the full-batch run does
            rows, index = shape[0] // n, data_rank(mesh[DATA_AXES[mesh.ndim]])[0]
            x = x[index * rows:(index + 1) * rows]
            window = None if window is None else window[index * rows:(index + 1) * rows]
        if mode.endswith("bf16"):  # FSDP2 mixed precision: bf16 compute, fp32 gradient reduction
            from torch.distributed.fsdp import MixedPrecisionPolicy
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        parallelize(m, mesh, program, name, layout=layout, dims=dims, vocab=vocab, load_balance=load_balance,
                    src_data_rank=source, **options)
    x = x.clone().requires_grad_(not tokens)
    # an encoder's further token inputs (BERT's token_type_ids), all type 0
    further = blockir.load(program).block(name).params[1:] if tokens else ()
    extra = tuple(torch.zeros_like(x) for _ in further)
    seen: dict[str, str] = {}

    def record(path: str) -> Any:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            seen.setdefault(path, _placements(args[0]))
        return hook

    hooks = [sub.register_forward_pre_hook(record(path)) for path, sub in m.named_modules()
             if path.count(".") <= 1 and path]
    lm = TokenLM(m, Layout((shape[1],), 0), causal=True) if vocab else None

    def forward() -> tuple[torch.Tensor, torch.Tensor | None]:
        """The output and, for a vocab case, the training loss of ``run`` (the logits caught on their way)."""
        if lm is None:
            return m(x, *extra), None
        caught = []
        hook = m.register_forward_hook(lambda module, args, out: caught.append(out))
        loss = lm(window)
        hook.remove()
        return caught[0], loss

    # the one-process module of a training case is also run in evaluation, for the comparison with the model it
    # was imported from (whose dropout draws other masks)
    evaluation = _evaluate(m, (x, *extra)) if m.training and layout is None else None
    # the forward draws its one dropout seed from torch's generator: every rank and the reference draw the same
    # (a training case's first step is the counted pass, seeded as ``_train`` seeds the others)
    _seed(10 if steps else 3)
    comms, planned, comms_backward, planned_backward, totals = {}, {}, {}, {}, [Counter(), Counter()]
    counted = layout is not None and dp == 1
    counter: Any = contextlib.nullcontext()
    if counted:
        from blockir.lower.distributed.comms import LayerCollectives
        plan = m.blockir_plan
        # what the plan lists outside the stacked layers (a final norm, an embedding, a head) is counted by site,
        # and the root "" (the model's own boundary, the loss) counts whatever runs outside every other site
        # A row-parallel linear outside the layers (OPT's project_out) reduces its output in a forward hook, which
        # runs after torch's module tracker has left the module: the counter sees that at the root.
        # A row-parallel linear inside another site (GPT-Neo's out_proj in its attention) is counted there.
        outer = {m.path for m in plan.modules if m.style == "rowwise"}
        listed = {c.site for c in plan.collectives.get("", []) + plan.backward.get("", [])}
        site = {s: s if s not in outer else _enclosing(s, listed - outer) for s in listed}
        tables = list(dict.fromkeys([""] + list(site.values())))
        counter = LayerCollectives(m, plan.layers + tables, dist.get_world_size())
        for got, listed in ((planned, plan.collectives), (planned_backward, plan.backward)):
            got |= {layer: Counter((c.op, c.elements) for c in listed.get(layer, [])) for layer in plan.layers}
            got |= {path: Counter((c.op, c.elements) for c in listed.get("", []) if site[c.site] == path)
                    for path in tables}
        planned[""] += Counter((c.op, c.elements) for c in plan.loss)  # loss_parallel's, outside every module
    with counter:
        y, loss = forward()
        if loss is not None:
            loss.backward()
        else:
            # the output gradient of the whole batch; a data-parallel rank takes its rows, scaled by dp (FSDP averages)
            grad_out = output_gradient((shape[0], *y.shape[1:]))
            y.backward(grad_out[index * rows:(index + 1) * rows].to(y.dtype) * n)
    if loss is not None:
        y = _full(y)  # the split logits gathered for the comparison, which the step does not send
    if counted:
        totals = [sum(seen.values(), Counter()) for seen in (counter.seen, counter.seen_backward)]
        comms, comms_backward = counter.seen, counter.seen_backward
    for h in hooks:
        h.remove()
    y, dx = y.detach().float(), None if tokens else x.grad.detach()
    if loss is not None:
        loss = loss.detach()
    if group is not None:
        y, dx = _gather_batch(y, group), None if tokens else _gather_batch(dx, group) / n
        # each dp rank's loss is the mean over its slice; FSDP averages their gradients, as the whole batch's mean
        loss = None if loss is None else _gather_batch(loss.reshape(1), group).mean()
    out = dict(y=y, dx=dx, loss=loss, state=state,
                params={k: _placements(p) for k, p in m.named_parameters()}, inputs=seen, comms=comms, planned=planned,
                comms_backward=comms_backward, planned_backward=planned_backward, totals=totals, evaluation=evaluation)
    grads = {("grads", k): p.grad for k, p in m.named_parameters()}
    if steps:  # the counted pass was the first step, whose gradients are gathered with the trained parameters
        # y is the whole batch's by now: each data-parallel rank adds its 1/dp share of the loss in ``_train``
        first = (y * grad_out).sum() / (1 if group is None else dist.get_world_size(group))
        out["losses"] = _train(m, (x, *extra), grad_out[index * rows:(index + 1) * rows] * n, group, first)
    whole = _whole(grads | ({("trained", k): p for k, p in m.named_parameters()} if steps else {}))
    for (part, key), t in whole.items():
        out.setdefault(part, {})[key] = t
    return out


def _evaluate(m: Any, x: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """Output, every parameter gradient and the loss ``Σ y · grad_out`` of one evaluation pass, the module's
    gradients then cleared again."""
    m.eval()
    y = m(*x)
    grad_out = output_gradient(tuple(y.shape))
    y.backward(grad_out)
    out = dict(y=y.detach().float(), loss=(y.detach().float() * grad_out).sum(),
               grads={k: p.grad.detach().clone() for k, p in m.named_parameters()})
    m.zero_grad(set_to_none=True)
    for t in x:
        t.grad = None
    m.train(True)
    return out


def _enclosing(path: str, sites: set[str]) -> str:
    """The nearest site above ``path``, or the root."""
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in sites:
            return path
    return ""


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within 1e-5 relative in fp32; the floor is for gradients that are zero in exact arithmetic (a key
    bias: softmax ignores a shift shared by all keys), whose rounding noise over a batch of 4 reaches 1e-6
    (RoBERTa's, 32 entries near 1e-7 each, split in two by data-parallel ranks)."""
    return (a - b).norm().item() <= 1e-5 * b.norm().item() + 4e-6


def trains_as_one_process(ref: dict[str, Any], par: dict[str, Any], dropped: bool = True) -> None:
    """Three SGD steps with dropout on: every step's loss and the parameters after the last (``dropped``: the
    model has dropout, so training differs from evaluation)."""
    assert close(par["losses"], ref["losses"]), (par["losses"], ref["losses"])
    assert set(par["trained"]) == set(ref["trained"])
    for key, p in ref["trained"].items():
        assert close(par["trained"][key], p), key
    # the steps really dropped (the first one's loss is not the evaluation's, by far more than fp32's rounding:
    # Nemotron's attention dropout moves it by 0.4%) and really moved the weights
    evaluated = ref["evaluation"]["loss"]
    assert (abs(ref["losses"][0] - evaluated) > 1e-3 * abs(evaluated)) == dropped
    assert abs(ref["losses"][2] - ref["losses"][0]) > 1e-1 * abs(ref["losses"][0])


def output_gradient(shape: tuple[int, ...]) -> torch.Tensor:
    """The fixed gradient every non-vocab case back-propagates from its whole batch's output."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(2))


STEPS, LR = 3, 1e-3  # the steps mode: optimizer steps of plain SGD, whose update is linear in the gradient


def _train(m: Any, x: tuple[torch.Tensor, ...], grad_out: torch.Tensor, group: Any, first: torch.Tensor
           ) -> torch.Tensor:
    """``STEPS`` steps of SGD in training mode (dropout on) on the loss ``Σ y · grad_out``, the first of which has
    run its forward and backward (loss ``first``): each step's loss, summed over the data-parallel ranks, as the
    whole batch's.

    Each forward seeds torch's generator alike on every rank, so the masks are those of one process; a data-parallel
    rank's ``grad_out`` is scaled by dp, FSDP's average of the gradients then being the whole batch's."""
    _sgd(m)
    losses = [first.detach()]
    for step in range(1, STEPS):
        m.zero_grad(set_to_none=True)
        _seed(10 + step)
        loss = (m(*x).float() * grad_out).sum()
        loss.backward()
        _sgd(m)
        losses.append(loss.detach() / (1 if group is None else dist.get_world_size(group)))
    total = torch.stack(losses)
    if group is not None:
        dist.all_reduce(total, group=group)
    return total


def _seed(seed: int) -> None:
    """Seed torch's CPU generator, which every op of these CPU tests draws from (``torch.manual_seed`` would also
    queue a seeding of CUDA, with a traceback of the call: a twentieth of a case's time)."""
    torch.default_generator.manual_seed(seed)


@torch.no_grad()
def _sgd(m: Any) -> None:
    """One step of plain SGD, ``p -= LR * p.grad``, as ``torch.optim.SGD`` takes it. A DTensor parameter whose
    gradient is placed as it is updates its local shard alone: the same numbers, without a dispatch of DTensor's
    per parameter. The pending sums of replicated parameters over a 1-D mesh (a norm's gain under the sequence
    layout) are reduced in one all-reduce of them all, as DTensor would reduce each alone (a round of messages
    each, a fifth of a training case's time). Any other goes through DTensor."""
    from torch.distributed.tensor import DTensor
    pending: dict[Any, list[Any]] = {}
    for p in m.parameters():
        if p.grad is None:
            continue
        if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements == p.placements:
            p.to_local().add_(p.grad.to_local(), alpha=-LR)
        elif isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.device_mesh.ndim == 1 and \
                p.placements[0].is_replicate() and p.grad.placements[0].is_partial("sum"):
            pending.setdefault(p.device_mesh.get_group(), []).append(p)
        else:
            p.add_(p.grad, alpha=-LR)
    for group, params in pending.items():
        total = torch.cat([p.grad.to_local().reshape(-1) for p in params])
        dist.all_reduce(total, group=group)
        for p, g in zip(params, total.split([p.numel() for p in params])):
            p.to_local().add_(g.view_as(p.to_local()), alpha=-LR)


TIMEOUT = 300  # seconds for one spawned world: a hung rendezvous fails its tests instead of hanging the suite
VOCAB = 50  # token ids are drawn below this: every vocabulary of the tests' models is larger
# program, block, dims, layout, shape, mode (eval, train, or eval-bf16: FSDP2 mixed precision), dp (a number of
# data-parallel ranks, or (replicate, shard) for HSDP), and optionally vocab (embedding and head split by vocabulary),
# the compile backend (fx when absent), load_balance (the context layout's zig-zag rows) and the parameters' source
# rank (``src_data_rank``; None: each rank's own values, which every rank compiled with the same seed)
Case = tuple[Any, ...]


def _entry(rank: int, world: int, store: str, out: str, body: Callable[..., Any], args: tuple[Any, ...]) -> None:
    faulthandler.enable()  # a rank that dies of a signal leaves its Python stack in the test's output
    torch.set_num_threads(1)
    # a file rendezvous: no port to race for when several test runs share the machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = body(*args)
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()
    # gloo can leave a joinable thread behind that aborts the interpreter's teardown (std::terminate, SIGABRT)
    # after a good run; the result is on disk and nothing else needs tearing down, so skip that teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# What every rank imports: the fork server imports it once, and forks each rank from itself with it in memory. A
# spawned rank would import torch afresh (seconds per world on two cores); a fork of the test process itself would
# inherit its threads and whatever state the tests before left behind. torch._dynamo is imported by the first
# distribute_tensor (0.6 s of every rank otherwise).
PRELOAD = ["torch", "torch.distributed.tensor", "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
           "torch.distributed.tensor.experimental", "torch._dynamo", "blockir", "blockir.lower.compile",
           "blockir.lower.distributed", "blockir.lower.distributed.comms", "blockir.lifecycle.token_lm", __name__]


@functools.cache
def _preload() -> None:
    mp.set_forkserver_preload(PRELOAD)


class World:
    """``body(*args)`` started on every rank of a fresh gloo process group of ``world`` ranks; ``result()`` waits
    for rank 0's result. A world that has not finished within ``TIMEOUT`` of its start is killed and raises, so a
    hung rendezvous fails its tests; so is one whose result is never asked for, when it is collected."""

    def __init__(self, body: Callable[..., Any], world: int, *args: Any, timeout: float = TIMEOUT) -> None:
        self.folder, self.timeout, self.ranks = tempfile.TemporaryDirectory(), timeout, None
        self.out, self.world = str(Path(self.folder.name) / "result.pt"), world
        _preload()
        self.ranks = mp.start_processes(_entry, args=(world, str(Path(self.folder.name) / "store"), self.out, body,
                                                      args), nprocs=world, join=False, start_method="forkserver")
        self.deadline = time.monotonic() + timeout

    def kill(self) -> None:
        for p in self.ranks.processes if self.ranks is not None else ():
            if p.is_alive():
                p.kill()
                p.join(5)

    def result(self) -> Any:
        try:
            while not self.ranks.join(timeout=1.0):
                if time.monotonic() > self.deadline:
                    raise TimeoutError(f"the {self.world}-rank world did not finish within {self.timeout:g} s")
            # rank 0's own file, read whole: the weights-only unpickler would check every object of it, seconds
            # for a world's hundreds of cases
            return torch.load(self.out, weights_only=False)
        finally:
            self.kill()
            self.folder.cleanup()

    __del__ = kill


def run_world(body: Callable[..., Any], world: int, *args: Any) -> Any:
    """``body(*args)`` on every rank of a fresh gloo process group of ``world`` ranks: rank 0's result."""
    return World(body, world, *args).result()


def _run_cases(cases: list[Case]) -> list[dict[str, Any]]:
    return [_run(*case) for case in cases]


def compare(cases: list[Case], world: int) -> list[tuple[Any, Any]]:
    """(reference, parallel) for each case, all parallel runs in one process group of ``world`` ranks (a
    ``Comparison`` and its result, which lets another world run meanwhile).

    A case runs on a ``(dp, world // dp)`` mesh when ``dp`` > 1, on a ``(replicate, shard, tp)`` one when ``dp``
    is a pair, else on one ``tp`` axis of all ranks (``cp`` for the context layout); a
    ``[B, S]`` shape feeds token ids (``dx`` is then None), a ``[B, S, D]`` one a random stream; a ninth entry
    compiles both modules with that backend instead of fx, a tenth, True, load-balances the context
    layout's rows (``parallelize(..., load_balance=True)``), and an eleventh is ``src_data_rank``. Each
    result holds the output ``y``, input gradient ``dx`` (both gathered over dp), parameter gradients
    ``grads`` (gathered), the placement of each parameter (``params``) and of the first input of each
    top-level submodule (``inputs``); on a 1-D mesh also the forward collectives each stacked layer issued
    (``comms``) and those the plan predicts for it (``planned``), as (kind, payload elements) counts, the same
    backward (``comms_backward``, ``planned_backward``), and everything the step issued, forward and backward
    (``totals``, wherever it ran: a fused module's inlined layers never run as modules). A case
    with ``vocab`` set splits the embedding and head by vocabulary, back-propagates the cross-entropy against
    fixed targets through ``run``'s training loss (``TokenLM``) instead of a random output gradient, returns
    that loss as ``loss`` and the logits gathered, and counts the embedding and the head as sites of their
    own. One spawn for many cases: starting ranks costs more than running them.
    """
    return Comparison(cases, world).result()


# the one-process results of the session, by ``Comparison.key``: a config two worlds run is computed once
_REFERENCES: dict[tuple[Any, ...], dict[str, Any]] = {}


class Comparison:
    """The parallel runs of ``cases``, started on ``world`` ranks; ``result()`` computes one reference per distinct
    module and input (cases that differ only in layout or mesh share it) while the ranks work, then pairs them.
    Two worlds started one after the other run together, in the time each spends waiting on its collectives."""

    def __init__(self, cases: list[Case], world: int) -> None:
        self.cases, self.world = cases, World(_run_cases, world, cases)

    @staticmethod
    def key(case: Case) -> tuple[Any, ...]:
        """What a case's reference depends on: its program's text (the same file written for two worlds shares one
        reference), block, sizes, input shape, mode and the further entries."""
        program, name, dims, _, shape, mode, _, *extra = case
        text = Path(program).read_text() if isinstance(program, str) and Path(program).is_file() else program
        return (text, name, tuple(sorted(dims.items())), shape, mode, *extra)

    def result(self) -> list[tuple[Any, Any]]:
        keys = [self.key(case) for case in self.cases]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as each rank runs: the cores are theirs
        try:
            for key, (program, name, dims, _, shape, mode, _, *extra) in zip(keys, self.cases):
                if key not in _REFERENCES:
                    _REFERENCES[key] = _run(program, name, dims, None, shape, mode, 1, *extra)
        except BaseException:
            self.world.kill()
            raise
        finally:
            torch.set_num_threads(threads)
        return [(_REFERENCES[key], par) for key, par in zip(keys, self.world.result())]


def start_alongside(request: Any, started: str, needed: str) -> None:
    """Set up the fixture ``started`` (a started ``Comparison``) now, when a test of the session uses the fixture
    ``needed`` that waits for it: its world then runs alongside the one the calling fixture is about to run."""
    if any(needed in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue(started)
