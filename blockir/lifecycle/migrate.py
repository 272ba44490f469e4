"""Converting a run checkpoint from one graph to another, with a conversion report.

The source checkpoint is checked against its hashes and against the source program; the candidate
model is built from the run's seed, so state the source never had is initialised by its declaration
(a LayerScale gain by its recipe's ``init``); carried parameters are renamed, transposed or reshaped
by the key plan, and so are their AdamW moments (a new parameter's moments start at zero at its
first step, as AdamW's do). The schedule, step and RNG counters carry over unchanged, so a run
resumed from the result continues the source's stream.

Whether the conversion may claim zero error is decided twice: by the graphs
(:func:`blockir.analyses.migration.check_function`) and by the numbers (both models' logits on one
fixed byte window, under the fp32 policy). A conversion whose function changes is refused unless
the caller accepts that its evidence will be training, never a zero-error claim.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from blockir.analyses.keys import Key, param_keys
from blockir.analyses.manifest import to_yaml
from blockir.analyses.migration import KeyMap, KeyPlan, check_function, new_state_decls, plan_keys
from blockir.lifecycle import checkpoint, state_check
from blockir.lifecycle.artifact_files import CONVERSION
from blockir.lifecycle.diverge import POLICIES
from blockir.lifecycle.session import RunConfig, build_model
from blockir.diagnostics import BlockError, Span, error
from blockir.ir.program import Block, Program

CORE = "core."
REPORT = CONVERSION
CHECK_ROWS = 2
EVIDENCE = "continued training on the candidate (blockir compare, blockir run --resume)"


@dataclass(frozen=True)
class Conversion:
    report: dict[str, Any]
    accepted: bool
    refusal: BlockError | None  # why it was refused, located at the first differing op


def _locator(program: Program, table: tuple[Key, ...]) -> Any:
    owners = {k.name: k for k in table}

    def locate(key: str) -> Span:
        k = owners.get(key)
        if k is not None and k.block in program.block_map:
            decl = program.block(k.block).decl_map.get(k.decl)
            if decl is not None:
                return decl.span
        return Span(program.filename, 1, 1)
    return locate


def _wrapper_keys(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    """The embedding, final norm and head around the block must carry over as they are."""
    a = {k: tuple(v.shape) for k, v in src.items() if not k.startswith(CORE)}
    b = {k: tuple(v.shape) for k, v in dst.items() if not k.startswith(CORE)}
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()))
        raise BlockError([error("E0727", "the language model around the two blocks differs (one ends with a final "
                                f"norm, the other does not: {', '.join(k for k, _ in diff)}); a conversion moves the "
                                "block's state only", Span("<checkpoint>", 1, 1))])


def _moved(t: torch.Tensor, transpose: bool, shape: tuple[int, ...] | None) -> torch.Tensor:
    if transpose:
        t = t.t()
    if shape is not None:
        t = t.reshape(shape)
    return t.contiguous().clone()


def _optimizer(src_opt: dict[str, Any], src_names: list[str], dst_names: list[str], plan: KeyPlan,
               dst_shapes: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], list[str]]:
    """AdamW's state with each carried parameter's moments moved like the parameter; new ones start empty."""
    index = {n: i for i, n in enumerate(src_names)}
    source = {CORE + m.target: (CORE + m.source, m) for m in plan.moves}
    state: dict[int, Any] = {}
    fresh = []
    for j, name in enumerate(dst_names):
        src_name, move = source.get(name, (name, None)) if name.startswith(CORE) else (name, None)
        entry = src_opt["state"].get(index[src_name]) if src_name in index and \
            (move is not None or not name.startswith(CORE)) else None
        if entry is None:
            fresh.append(name)
            continue
        shape = dst_shapes[name] if move is not None and move.reshape else None
        transpose = move is not None and move.transpose
        state[j] = {k: _moved(v, transpose, shape) if torch.is_tensor(v) and v.dim() > 0 else v
                    for k, v in entry.items()}
    group = {k: v for k, v in src_opt["param_groups"][0].items() if k != "params"}
    return {"state": state, "param_groups": [{**group, "params": list(range(len(dst_names)))}]}, fresh


def convert(src: Program, a: Block, dst: Program, b: Block, ckpt: str, keymap: KeyMap | None,
            out: str | None, allow_function_change: bool, src_file: str, dst_file: str) -> Conversion:
    record = checkpoint.check_program(ckpt, src, a.name)
    cfg = RunConfig(**record["config"])
    state = checkpoint.read_state(ckpt)
    src_model, _ = build_model(src, a, cfg)
    src_model.load_state_dict(state_check.tensors(state["model"], src_model.state_dict(), f"{ckpt}/model.pt", a.name),
                              strict=True)
    reference = torch.optim.AdamW(src_model.parameters())  # the form a trainer's optimizer and schedule take
    schedule = torch.optim.lr_scheduler.LambdaLR(reference, lambda _: 1.0).state_dict()
    state_check.optimizer(state["optimizer"], reference, list(src_model.parameters()), f"{ckpt}/optimizer.pt")
    state_check.counters(state, schedule, f"{ckpt}/counters.pt")
    dst_model, _ = build_model(dst, b, cfg)  # new state: initialised from the run's seed by its declaration
    src_state, dst_state = src_model.state_dict(), dst_model.state_dict()
    _wrapper_keys(src_state, dst_state)
    src_table, dst_table = param_keys(src, a.name, cfg.dims).keys, param_keys(dst, b.name, cfg.dims).keys
    core = {k[len(CORE):]: tuple(v.shape) for k, v in dst_state.items() if k.startswith(CORE)}
    plan = plan_keys({k[len(CORE):]: tuple(v.shape) for k, v in src_state.items() if k.startswith(CORE)}, core,
                     keymap, _locator(dst, dst_table), _locator(src, src_table))
    owners = {k.name: k for k in dst_table}
    new_keys = tuple(owners.get(k, Key(k, core[k], k, "extern")) for k in plan.new)
    function = check_function(src, a, dst, b, new_keys)

    migrated = {k: v.clone() for k, v in dst_state.items()}
    for k in src_state:
        if not k.startswith(CORE):
            migrated[k] = src_state[k].clone()
    for m in plan.moves:
        migrated[CORE + m.target] = _moved(src_state[CORE + m.source], m.transpose,
                                           core[m.target] if m.reshape else None)
    dst_model.load_state_dict(migrated, strict=True)
    error_max, bound = _check(src_model, dst_model, cfg.seed)

    exact = function.verdict == "same" and error_max <= bound
    accepted = exact or function.verdict == "extends" or allow_function_change
    refusal = None
    if not accepted:
        span, text = function.first_target or (b.span, b.name)
        why = function.reason if function.verdict == "changes" else \
            f"the graphs agree but the converted weights do not compute the source's function (max |Δ| " \
            f"{error_max:.3e} > {bound:.3e}): a transpose or reshape the map makes changes it"
        refusal = BlockError([error("E0726", f"{dst_file}:{b.name} does not compute the function of {src_file}:{a.name} ({why}; first "
                                    f"difference: {text}); no conversion of it can claim zero error", span,
                                    hint="its evidence is training: pass --allow-function-change to convert it "
                                         "anyway, then train and compare")])
    src_names = [n for n, _ in src_model.named_parameters()]
    dst_names = [n for n, _ in dst_model.named_parameters()]
    optimizer, fresh = _optimizer(state["optimizer"], src_names, dst_names, plan,
                                  {n: tuple(p.shape) for n, p in dst_model.named_parameters()})
    declared = new_state_decls(dst, new_keys)
    report: dict[str, Any] = {
        "status": "converted" if accepted else "refused",
        "source": {"file": src_file, "block": a.name, "checkpoint": ckpt, "program_sha256": record["program_sha256"],
                   "model_sha256": record["sha256"]["model.pt"], "step": record["step"]},
        "candidate": {"file": dst_file, "block": b.name, "program_sha256": checkpoint.program_digest(dst)},
        "map": {"file": keymap.filename, "sha256": keymap.sha256} if keymap is not None else None,
        "function": {"verdict": function.verdict, "reason": function.reason,
                     **({"first_difference": {"source": _where(function.first_source),
                                              "candidate": _where(function.first_target)}}
                        if function.first_source or function.first_target else {})},
        "keys": {"carried": len(plan.moves),
                 "renamed": [{"from": m.source, "to": m.target} for m in plan.renamed],
                 "transposed": [m.target for m in plan.moves if m.transpose],
                 "reshaped": [m.target for m in plan.moves if m.reshape],
                 "new": [{"key": k, "shape": list(core[k]), "initialised_by": declared[k]} for k in plan.new],
                 "dropped": list(plan.dropped)},
        "optimizer": {"carried": len(dst_names) - len(fresh), "fresh": fresh},
        "counters": "carried: schedule, step, torch generator, batch sampler",
        "check": {"input": f"{CHECK_ROWS} windows of random bytes from seed {cfg.seed}", "compared": "logits",
                  "policy": "fp32", "max_abs_error": error_max, "bound": bound},
        "zero_error_claim": exact,
        "evidence_required": "none: the conversion is exact" if exact else EVIDENCE,
        "output": out if accepted and out else None,
    }
    if accepted and out:
        text = to_yaml(report, report=True).encode()
        checkpoint.write(out, dst, b.name, dst_file, record["config"],
                         {"data": record["data"], "data_sha256": record["data_sha256"]},
                         {**state, "model": dst_model.state_dict(), "optimizer": optimizer}, {REPORT: text})
    return Conversion(report, accepted, refusal)


def _where(site: tuple[Span, str] | None) -> str | None:
    return None if site is None else f"{site[0].filename}:{site[0].line}:{site[0].column}: {site[1]}"


@torch.no_grad()
def _check(src_model: Any, dst_model: Any, seed: int) -> tuple[float, float]:
    """max |dst - src| of the logits on fixed random bytes, and the fp32 policy's bound for it."""
    window = torch.randint(0, 256, (CHECK_ROWS, src_model.shape.window), generator=torch.Generator().manual_seed(seed))
    src_model.eval()
    dst_model.eval()
    ref, _ = src_model.logits(window)
    cand, _ = dst_model.logits(window)
    policy = POLICIES["fp32"]
    if not bool(torch.isfinite(cand).all()):
        return float("inf"), 0.0
    return float((cand - ref).abs().max()), policy.atol + policy.rtol * float(ref.abs().max())
