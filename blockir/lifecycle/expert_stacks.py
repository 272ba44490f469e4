"""Per-expert matrices of a checkpoint → the stacked expert tensors a ``moe`` branch holds.

Released MoE checkpoints, and the folders transformers 5 itself saves, store each expert's
matrices apart (Mixtral's ``experts.3.w1.weight``, Qwen's ``experts.3.gate_proj.weight``);
transformers stacks them on load, as this module does: the gate matrices of all experts, then
their up matrices, become ``gate_up_proj`` [E, 2H, D] (each expert's gate rows first), and the down
matrices ``down_proj`` [E, D, H]. A stacked tensor is built as soon as its last matrix is read and
its parts are dropped, so loading holds at most one stack's parts besides the weights loaded.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from blockir.lifecycle.hf_folder import fail

EXPERT = re.compile(r"^(?P<owner>.+\.experts)\.(?P<index>\d+)\.(?P<name>w1|w2|w3|gate_proj|up_proj|down_proj)"
                    r"\.weight$")
# a stored matrix's name -> the stacked tensor it joins and its part there (0: gate or down, 1: up)
STACKED = {"w1": ("gate_up_proj", 0), "gate_proj": ("gate_up_proj", 0), "w3": ("gate_up_proj", 1),
           "up_proj": ("gate_up_proj", 1), "w2": ("down_proj", 0), "down_proj": ("down_proj", 0)}


def expert_slot(key: str) -> tuple[str, int, int] | None:
    """(the stacked key, expert, part) of a per-expert matrix's key; None for any other key."""
    m = EXPERT.match(key)
    if m is None:
        return None
    stacked, part = STACKED[m["name"]]
    return f"{m['owner']}.{stacked}", int(m["index"]), part


class Stacks:
    """Collects the per-expert matrices of each stacked key until they are complete."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[tuple[int, int], torch.Tensor]] = {}
        self.first: dict[str, Path] = {}  # the file each stack's first matrix came from

    def add(self, stacked: str, expert: int, part: int, tensor: torch.Tensor, meta: torch.Tensor, stored: str,
            path: Path) -> torch.Tensor | None:
        """Keep one matrix of ``stacked``; the stacked tensor, in ``meta``'s dtype, once every matrix is kept."""
        experts, parts = meta.shape[0], 2 if stacked.endswith("gate_up_proj") else 1
        want = (meta.shape[1] // parts, meta.shape[2])
        if expert >= experts or tuple(tensor.shape) != want:
            raise fail("E0836", f"{path}: {stored}", f"{stored} has shape {list(tensor.shape)} in {path.name}, but "
                       f"the model built from config.json stacks {experts} experts of {list(want)}",
                       "the weights were saved from another configuration; pair them with their own config.json")
        found = self.parts.setdefault(stacked, {})
        self.first.setdefault(stacked, path)
        found[(part, expert)] = tensor
        if len(found) < parts * experts:
            return None
        del self.parts[stacked]
        blocks = [torch.stack([found[(p, e)] for e in range(experts)]) for p in range(parts)]
        return torch.cat(blocks, dim=1).to(dtype=meta.dtype)

    def check_complete(self, metas: dict[str, torch.Tensor]) -> None:
        """A stack some of whose matrices no file holds is refused (E0834)."""
        for stacked, found in self.parts.items():
            experts, parts = metas[stacked].shape[0], 2 if stacked.endswith("gate_up_proj") else 1
            part, expert = next((p, e) for p in range(parts) for e in range(experts) if (p, e) not in found)
            raise fail("E0834", str(self.first[stacked].parent), f"the checkpoint stores {len(found)} of the "
                       f"{parts * experts} expert matrices of {stacked} (none for expert {expert})",
                       "the checkpoint is incomplete, or config.json describes another model")
