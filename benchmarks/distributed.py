"""The derived tensor-parallel plan against a hand-written one, and its communication against the closed form.

Both plans parallelise the same compiled LLaMA-style model (examples/llama.block) on the same engine
(DTensor and ``parallelize_module`` over gloo on the loopback interface): the derived one through
``blockir.parallelize``, the hand-written one as torchtitan's ``parallelize_llama`` writes a
sequence-parallel decoder layer, a dict of ``ColwiseParallel`` / ``RowwiseParallel`` /
``SequenceParallel`` / ``PrepareModuleInput`` per layer. A step is one forward and backward; the ratio is
the median derived step over the median hand-written step. Communication is counted at the dispatcher:
every functional collective a forward issues inside a layer, by kind and payload (the full tensor it
moves), against the plan's closed form per layer; and, with ``CommDebugMode``, every collective of a whole
forward and backward with its operand bytes, derived against hand-written.

The same count compares the language model around that decoder (token ids in, a next-token loss out) with
its embedding and head split by vocabulary: the derived plan (``parallelize(..., vocab=True)``, the loss
through ``blockir.lower.distributed.loss.cross_entropy``) against torchtitan's hand-written one
(``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))`` on the embedding,
``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))`` on the head, the cross-entropy and its
backward under ``loss_parallel()``), over a whole forward and backward.

With ``--family NAME`` (or ``all``) it instead builds each imported HF causal LM that has a hand-written plan in
``hand_plans.py`` (41 families, five mixtures of experts among them) from a config at those
sizes and compares, under the sequence and replicated layouts, the derived
plan (``vocab=True``) with that family's hand-written plan (``hand_plans.py``): collectives and operand bytes of
one next-token loss and its backward, the losses against one process's, and the median step of each.

    python benchmarks/distributed.py [--world 2] [--dims B=4,S=128,D=256,F=512,H=8] [--layers 4] [--steps 15]
                                     [--vocab-size 8192] [--family NAME|all]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

import blockir
from blockir.api import hf_block_text
from blockir.lower.distributed.comms import LayerCollectives
from blockir.lower.distributed.loss import cross_entropy

sys.path.append(str(Path(__file__).resolve().parent))  # hand_plans.py, also when this file is loaded by its path
from hand_plans import FAMILIES, LAYOUTS as HAND_LAYOUTS, hand_written, hand_written_family  # noqa: E402

LAYOUTS = ("replicated", "sequence", "hidden")
COLLECTIVES = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")


class Traffic(CommDebugMode):
    """``CommDebugMode``, which also adds up each collective's operand bytes; both by pass (forward, backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"forward": Counter(), "backward": Counter()}
        self.moved = {"forward": Counter(), "backward": Counter()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and not isinstance(func, torch._ops.HigherOrderOperator):
            name = func._overloadpacket.__name__
            if name in COLLECTIVES:
                phase = "backward" if self.advanced_module_tracker.is_bw else "forward"
                self.calls[phase][name] += 1
                self.moved[phase][name] += args[0].numel() * args[0].element_size()
        return out


def traffic(model: torch.nn.Module, x: torch.Tensor) -> Traffic:
    """The collectives of one forward and backward of ``model`` on ``x``, counted by ``CommDebugMode``."""
    with Traffic() as mode:
        model(x).sum().backward()
    model.zero_grad()
    return mode


def lm_step(model: torch.nn.Module, ids: torch.Tensor, target: torch.Tensor, hand: bool) -> float:
    """One next-token loss and its backward; the loss. The derived model's loss goes through blockir's
    ``cross_entropy``, the hand-written one's as torchtitan writes it, forward and backward under
    ``loss_parallel()``."""
    from torch.distributed.tensor.parallel import loss_parallel
    if hand:
        with loss_parallel():
            logits = model(ids)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
            loss.backward()
        loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    else:
        loss = cross_entropy(model(ids), target)
        loss.backward()
    return loss.item()


def lm_traffic(model: torch.nn.Module, ids: torch.Tensor, target: torch.Tensor, hand: bool) -> Traffic:
    """The collectives of one next-token loss and its backward (``lm_step``); ``mode.loss`` is the loss."""
    with Traffic() as mode:
        mode.loss = lm_step(model, ids, target, hand)
    model.zero_grad()
    return mode


def step_times(models: dict[str, torch.nn.Module], x: torch.Tensor, steps: int) -> dict[str, float]:
    """Median step of each model, the models taking turns each round so load on a shared machine hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(steps + 2):
        for name, model in models.items():
            dist.barrier()
            start = time.perf_counter()
            model(x).sum().backward()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t[2:]) for name, t in times.items()}


def worker(rank: int, world: int, store: str, out: str, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    program, dims = build(args)
    x = torch.randn(dims["B"], dims["S"], dims["D"], generator=torch.Generator().manual_seed(0))
    models, result = {}, {}
    for layout in LAYOUTS:
        m = models[layout] = blockir.compile(program, "LlamaModel", dims=dims, seed=0)
        blockir.parallelize(m, mesh, program, "LlamaModel", layout=layout, dims=dims)
        with LayerCollectives(m, m.blockir_plan.layers, world) as counter, torch.no_grad():
            m(x)
        result[layout] = {"seen": counter.seen, "plan": m.blockir_plan}
    models["hand-written"] = blockir.compile(program, "LlamaModel", dims=dims, seed=0)
    hand_written(models["hand-written"], mesh, args.layers)
    for name, m in models.items():
        mode = traffic(m, x)
        result.setdefault("traffic", {})[name] = (mode.calls, mode.moved)
    result["time"] = step_times(models, x, args.steps)
    lm, lm_dims = build_lm(args, dims)
    ids, target = (torch.randint(0, args.vocab_size, (dims["B"], dims["S"]), generator=torch.Generator().manual_seed(i))
                   for i in (1, 2))
    for layout in LAYOUTS:
        m = blockir.compile(lm, "LlamaForCausalLM", dims=lm_dims, seed=0)
        blockir.parallelize(m, mesh, lm, "LlamaForCausalLM", layout=layout, dims=lm_dims, vocab=True)
        mode = lm_traffic(m, ids, target, hand=False)
        result.setdefault("lm_traffic", {})[f"derived, {layout}, vocab=True"] = (mode.calls, mode.moved)
    m = blockir.compile(lm, "LlamaForCausalLM", dims=lm_dims, seed=0)
    hand_written_family(m, mesh, "llama", "sequence")
    mode = lm_traffic(m, ids, target, hand=True)
    result["lm_traffic"]["hand-written (torchtitan-style, sequence, loss_parallel)"] = (mode.calls, mode.moved)
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort the interpreter's teardown after a good run


def lm_step_times(models: dict[str, tuple[torch.nn.Module, bool]], ids: torch.Tensor, target: torch.Tensor,
                  steps: int) -> dict[str, float]:
    """Median next-token step (``lm_step``) of each (model, hand-written) pair, taking turns each round."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(steps + 2):
        for name, (model, hand) in models.items():
            dist.barrier()
            start = time.perf_counter()
            lm_step(model, ids, target, hand)
            times[name].append(time.perf_counter() - start)
            model.zero_grad()
    return {name: statistics.median(t[2:]) for name, t in times.items()}


def family_worker(rank: int, world: int, store: str, out: str, args: argparse.Namespace) -> None:
    """Each family's causal LM under each layout a hand author writes: the derived plan (``vocab=True``) and the
    hand-written one, their collectives and bytes over one next-token loss and its backward, their losses (which
    must agree with each other and with one process) and their median steps."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    dims = {k: int(v) for k, v in (item.split("=") for item in args.dims.split(","))}
    ids, target = (torch.randint(0, args.vocab_size, (dims["B"], dims["S"]), generator=torch.Generator().manual_seed(i))
                   for i in (1, 2))
    result: dict = {}  # type: ignore[type-arg]
    for family in (FAMILIES if args.family == "all" else [args.family]):
        program, lm_dims = build_family(family, args, dims)
        block = FAMILIES[family].block
        one = blockir.compile(program, block, dims=lm_dims, seed=0)
        reference = F.cross_entropy(one(ids).reshape(-1, args.vocab_size), target.reshape(-1)).item()
        for layout in HAND_LAYOUTS:
            derived = blockir.compile(program, block, dims=lm_dims, seed=0)
            blockir.parallelize(derived, mesh, program, block, layout=layout, dims=lm_dims, vocab=True)
            hand = blockir.compile(program, block, dims=lm_dims, seed=0)
            hand_written_family(hand, mesh, family, layout)
            row = result.setdefault(family, {}).setdefault(layout, {"reference loss": reference})
            for name, m, is_hand in (("derived", derived, False), ("hand-written", hand, True)):
                mode = lm_traffic(m, ids, target, is_hand)
                row[name] = (mode.calls, mode.moved, mode.loss)
                row.setdefault("held", {})[name] = held_bytes(m)
            row["time"] = lm_step_times({"derived": (derived, False), "hand-written": (hand, True)}, ids, target,
                                        args.steps)
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def held_bytes(model: torch.nn.Module) -> int:
    """The parameter bytes this rank stores: each DTensor's local shard, a tied table once."""
    from torch.distributed.tensor import DTensor
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() * p.element_size() for p in model.parameters())


def build_family(family: str, args: argparse.Namespace,
                 dims: dict[str, int]) -> tuple[blockir.ir.program.Program, dict[str, int]]:
    """The importer's text of ``family``'s causal LM at the benchmark's sizes (no weights read)."""
    config = FAMILIES[family].config(family, hidden=dims["D"], layers=args.layers, heads=dims["H"],
                                     kv_heads=args.kv_heads, intermediate=dims["F"], vocab=args.vocab_size,
                                     seq=dims["S"])
    return blockir.parse(hf_block_text(config), f"{family}.block"), {"B": dims["B"], "S": dims["S"]}


def family_table(result: dict) -> None:  # type: ignore[type-arg]
    print("\n| family | layout | plan | forward collectives | backward collectives | forward bytes | backward bytes | "
          "bytes / hand-written | parameter bytes per rank | / hand-written | step ms | step / hand-written | "
          "loss − one process |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for family, layouts in result.items():
        for layout, row in layouts.items():
            _, hand_moved, _ = row["hand-written"]
            total = sum(hand_moved["forward"].values()) + sum(hand_moved["backward"].values())
            for name in ("derived", "hand-written"):
                calls, moved, loss = row[name]
                fwd, bwd = sum(moved["forward"].values()), sum(moved["backward"].values())
                t, base = row["time"][name], row["time"]["hand-written"]
                held, held_hand = row["held"][name], row["held"]["hand-written"]
                print(f"| {family} | {layout} | {name} | {sum(calls['forward'].values())} | "
                      f"{sum(calls['backward'].values())} | {fwd} | {bwd} | {(fwd + bwd) / total:.2f} | "
                      f"{held} | {held / held_hand:.2f} | "
                      f"{t * 1e3:.1f} | {t / base:.2f} | {loss - row['reference loss']:.1e} |")
    for family, layouts in result.items():
        for layout, row in layouts.items():
            for name in ("derived", "hand-written"):
                calls, moved, _ = row[name]
                print(f"# {family}, {layout}, {name}: forward {dict(calls['forward'])} {dict(moved['forward'])}, "
                      f"backward {dict(calls['backward'])} {dict(moved['backward'])}")


def build(args: argparse.Namespace) -> tuple[blockir.ir.program.Program, dict[str, int]]:
    dims = {k: int(v) for k, v in (item.split("=") for item in args.dims.split(","))}
    text = Path("examples/llama.block").read_text().replace("LlamaDecoderLayer * 2", f"LlamaDecoderLayer * {args.layers}")
    text = text.replace("kv_heads=2", f"kv_heads={args.kv_heads}")
    return blockir.parse(text, "llama.block"), dims


def build_lm(args: argparse.Namespace, dims: dict[str, int]) -> tuple[blockir.ir.program.Program, dict[str, int]]:
    """The causal LM around the same decoder (the importer's text of a LLaMA config: no weights read)."""
    config = dict(model_type="llama", vocab_size=args.vocab_size, hidden_size=dims["D"], intermediate_size=dims["F"],
                  num_hidden_layers=args.layers, num_attention_heads=dims["H"], num_key_value_heads=args.kv_heads,
                  max_position_embeddings=dims["S"], rms_norm_eps=1e-6)
    return blockir.parse(hf_block_text(config), "llama_lm.block"), {"B": dims["B"], "S": dims["S"]}


def traffic_table(traffic: dict, base: str) -> None:  # type: ignore[type-arg]
    hand_calls, hand_bytes = traffic[base]
    print("\n| plan | forward collectives | backward collectives | forward bytes | backward bytes | "
          "bytes / hand-written |\n|---|---:|---:|---:|---:|---:|")
    total = sum(hand_bytes["forward"].values()) + sum(hand_bytes["backward"].values())
    for name, (calls, moved) in traffic.items():
        fwd, bwd = sum(moved["forward"].values()), sum(moved["backward"].values())
        print(f"| {name} | {sum(calls['forward'].values())} | {sum(calls['backward'].values())} | {fwd} | {bwd} | "
              f"{(fwd + bwd) / total:.2f} |")


def fmt(c: Counter) -> str:
    return ", ".join(f"{n}× {k} {e}" for (k, e), n in sorted(c.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--dims", default="B=4,S=128,D=256,F=512,H=8")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--family", choices=(*FAMILIES, "all"),
                    help="compare each imported family's causal LM with its hand-written plans instead")
    args = ap.parse_args()
    if args.family:
        with tempfile.TemporaryDirectory() as d:
            out = str(Path(d) / "result.pt")
            mp.spawn(family_worker, args=(args.world, str(Path(d) / "store"), out, args), nprocs=args.world, join=True)
            result = torch.load(out, weights_only=False)
        print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC — {platform.machine()} "
              f"({os.cpu_count()} cores), torch {torch.__version__}, gloo, world {args.world}, one thread per rank; "
              f"causal LMs of {args.layers} layers, {args.dims}, kv_heads={args.kv_heads}, vocabulary "
              f"{args.vocab_size} split by rows, next-token loss, fp32, median of {args.steps} steps")
        print(f"# command: python {' '.join(sys.argv)}")
        family_table(result)
        return
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "result.pt")
        mp.spawn(worker, args=(args.world, str(Path(d) / "store"), out, args), nprocs=args.world, join=True)
        result = torch.load(out, weights_only=False)
    base = result["time"]["hand-written"]
    print(f"# {datetime.date.today()} — {platform.machine()} ({os.cpu_count()} cores), torch {torch.__version__}, "
          f"gloo, world {args.world}, one thread per rank; LlamaModel {args.layers} layers, {args.dims}, "
          f"kv_heads={args.kv_heads}, fp32")
    print(f"# command: python {' '.join(sys.argv)}")
    print("\n| plan | step (fwd+bwd) ms | ratio to hand-written |\n|---|---:|---:|")
    print(f"| hand-written (torchtitan-style, sequence) | {base * 1e3:.1f} | 1.00 |")
    for layout in LAYOUTS:
        t = result["time"][layout]
        print(f"| derived, {layout} | {t * 1e3:.1f} | {t / base:.2f} |")
    print("\n| layout | per layer, measured (forward) | per layer, plan | bytes measured | bytes plan | equal |\n"
          "|---|---|---|---:|---:|---|")
    for layout in LAYOUTS:
        seen, plan = result[layout]["seen"], result[layout]["plan"]
        measured = seen["layers.0"]
        expected = Counter((c.op, c.elements) for c in plan.collectives["layers.0"])
        mb, pb = (4 * sum(e * n for (_, e), n in c.items()) for c in (measured, expected))
        print(f"| {layout} | {fmt(measured)} | {fmt(expected)} | {mb} | {pb} | {measured == expected} |")
    traffic_table(result["traffic"], "hand-written")
    print(f"\nLlamaForCausalLM, vocabulary {args.vocab_size}, next-token loss:")
    traffic_table(result["lm_traffic"], "hand-written (torchtitan-style, sequence, loss_parallel)")
    for name, (calls, _) in result["lm_traffic"].items():
        print(f"# {name}: forward {dict(calls['forward'])}, backward {dict(calls['backward'])}")


if __name__ == "__main__":
    main()
