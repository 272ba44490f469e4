"""The state files of a checkpoint, checked against the model, optimizer and schedule they are loaded into.

``torch.load`` gives back whatever was saved: a bare tensor, a dict of other shapes, an optimizer
state whose moments do not match its parameters, RNG states of another generator. Each is compared
with what the receiving object holds *before* anything is loaded, so a bad file is a located
``E0735`` naming the file and the entry, never a traceback halfway through a restore.
"""
from __future__ import annotations

import io
import math
from typing import Any, Mapping

import torch

from blockir.lifecycle.artifact_files import where
from blockir.diagnostics import BlockError, error

ADAMW_STATE = ("step", "exp_avg", "exp_avg_sq")


def state_error(message: str, path: str, field: str | None = None, hint: str | None = None) -> BlockError:
    return BlockError([error("E0735", message, where(path, field), hint=hint)])


def load_bytes(data: bytes, path: str) -> Any:
    """A torch file's content, with torch's own safe loader (tensors and plain containers only)."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # the unpickler raises many kinds; every one means the file is not ours
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise state_error(f"not a torch state file: {first}", path) from None


def tensors(state: Any, expected: Mapping[str, torch.Tensor], path: str, what: str) -> dict[str, torch.Tensor]:
    """``state`` if it maps exactly ``expected``'s names to tensors of their shapes and dtypes."""
    if not isinstance(state, dict):
        raise state_error(f"holds a {type(state).__name__}, not the name → tensor table of {what}", path)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(str(k) for k in set(state) - set(expected))
    if missing or unexpected:
        raise state_error(f"does not hold {what}'s parameters at these sizes (missing {missing[:3]}, unexpected "
                          f"{unexpected[:3]})", path, hint="load a checkpoint saved from this program at these sizes")
    for name, want in expected.items():
        got = state[name]
        if not isinstance(got, torch.Tensor):
            raise state_error(f"holds a {type(got).__name__}, not a tensor", path, name)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise state_error(f"is {got.dtype} {list(got.shape)}; {what} declares {want.dtype} {list(want.shape)}",
                              path, name)
    return state


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _like(got: Any, want: Any) -> bool:
    """A loaded value of the kind the receiving object holds (numbers finite, sequences of the same length)."""
    if want is None:
        return got is None or isinstance(got, bool)
    if isinstance(want, bool):
        return isinstance(got, bool)
    if isinstance(want, (int, float)):
        return _number(got) or isinstance(got, torch.Tensor) and got.numel() == 1 and bool(torch.isfinite(got).all())
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(_like(g, w) for g, w in zip(got, want))
    return type(got) is type(want)


def optimizer(state: Any, opt: torch.optim.Optimizer, params: list[torch.Tensor], path: str) -> dict[str, Any]:
    """AdamW's saved state, if it fits the optimizer's parameter groups and each moment its parameter."""
    ours = opt.state_dict()
    if not isinstance(state, dict) or set(state) != {"state", "param_groups"}:
        raise state_error("is not an optimizer state (a table of 'state' and 'param_groups')", path)
    groups = state["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(ours["param_groups"]):
        raise state_error(f"holds {len(groups) if isinstance(groups, list) else 'no'} parameter groups; the "
                          f"optimizer has {len(ours['param_groups'])}", path, "param_groups")
    for i, (got, want) in enumerate(zip(groups, ours["param_groups"])):
        if not isinstance(got, dict) or set(got) != set(want):
            raise state_error("does not hold AdamW's settings", path, f"param_groups[{i}]")
        for key, value in want.items():
            if key == "params" and got[key] != value or key != "params" and not _like(got[key], value):
                raise state_error(f"is {got[key]!r:.60}, not a value of the kind AdamW keeps there", path,
                                  f"param_groups[{i}].{key}")
    entries = state["state"]
    if not isinstance(entries, dict):
        raise state_error("does not hold per-parameter state", path, "state")
    for index, entry in entries.items():
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(params):
            raise state_error(f"names parameter {index!r}, which the optimizer does not have", path, "state")
        if not isinstance(entry, dict) or set(entry) != set(ADAMW_STATE):
            raise state_error(f"is not AdamW's state ({', '.join(ADAMW_STATE)})", path, f"state[{index}]")
        if not _like(entry["step"], 0.0):
            raise state_error("is not a finite step count", path, f"state[{index}].step")
        for key in ADAMW_STATE[1:]:
            if not _like(entry[key], params[index]):
                raise state_error(f"does not have its parameter's shape {list(params[index].shape)}", path,
                                  f"state[{index}].{key}")
    return state


COUNTERS = ("schedule", "step", "rng")


def counters(state: Any, schedule: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The schedule, step and both RNG states (of ``state``, which may hold more), each of the form the trainer
    keeps."""
    if not isinstance(state, dict) or not set(COUNTERS) <= set(state):
        raise state_error("is not a counters file (a table of 'schedule', 'step' and 'rng')", path)
    sched = state["schedule"]
    if not isinstance(sched, dict) or set(sched) != set(schedule):
        raise state_error("is not the warmup schedule's state", path, "schedule")
    for key, want in schedule.items():
        if not _like(sched[key], want):
            raise state_error(f"is {sched[key]!r:.60}, not a value of the kind the schedule keeps there", path,
                              f"schedule.{key}")
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise state_error(f"is {step!r:.40}, not a step count", path, "step")
    rng = state["rng"]
    if not isinstance(rng, dict) or set(rng) != {"torch", "batches"}:
        raise state_error("does not hold the two generators' states ('torch' and 'batches')", path, "rng")
    want = torch.get_rng_state()
    for key in ("torch", "batches"):
        if not _like(rng[key], want):
            raise state_error(f"is not a generator state ({want.dtype} [{want.numel()}])", path, f"rng.{key}")
        try:
            torch.Generator().set_state(rng[key])
        except RuntimeError as exc:
            raise state_error(f"is not a valid generator state: {exc}", path, f"rng.{key}") from None
    return state
