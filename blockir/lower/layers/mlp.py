"""Feed-forward branches: the two-layer MLP and the gated MLP (SwiGLU, GeGLU), under a checkpoint's names."""
from __future__ import annotations

from typing import Callable, ClassVar

from torch import Tensor, nn

from blockir.lower.boundary import NOTHING
from blockir.lower.layers.dense import dense
from blockir.lower.layers.fixup_bias import ACT, OUT, add_biases, shift
from blockir.lower.layers.numerics import ACTIVATIONS


def activation(name: str) -> Callable[[Tensor], Tensor]:
    """Look up an activation by name, failing with the list of valid names."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}") from None


class MLP(nn.Module):
    """Two-layer feed-forward branch ``fc2(act(fc1(x)))``, its layers under the checkpoint's names."""

    def __init__(self, width: int, hidden: int, act: str = "gelu", bias: bool = True, *, fc1: str = "fc1",
                 fc2: str = "fc2", conv1d: bool = False, fixup_bias: bool = False) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=activation(act), names={"fc1": fc1, "fc2": fc2})
        self.add_module(fc1, dense(width, hidden, bias, conv1d))
        self.add_module(fc2, dense(hidden, width, bias, conv1d))
        if fixup_bias:
            add_biases(self, ACT, OUT)

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        h = shift(self.act(shift(getattr(self, self.names["fc1"])(x), self, ACT)), self, OUT)
        return getattr(self, self.names["fc2"])(h)

    def extra_repr(self) -> str:
        return f"act={self.act_name}"


class GatedMLP(nn.Module):
    """Gated feed-forward branch ``down(act(gate(x)) * up(x))`` (SwiGLU for ``act="silu"``).

    ``fused`` stores gate and up as one matrix whose first half of rows is the gate (Phi-3's
    ``gate_up_proj``).
    """

    def __init__(self, width: int, hidden: int, act: str = "silu", bias: bool = False, *, gate: str = "gate_proj",
                 up: str = "up_proj", down: str = "down_proj", gate_up: str = "gate_up_proj",
                 fused: bool = False, fixup_bias: bool = False) -> None:
        super().__init__()
        vars(self).update(act_name=act, act=activation(act), fused=fused,
                          names={"gate": gate, "up": up, "down": down, "gate_up": gate_up})
        if fused:
            self.add_module(gate_up, nn.Linear(width, 2 * hidden, bias=bias))
        else:
            self.add_module(gate, nn.Linear(width, hidden, bias=bias))
            self.add_module(up, nn.Linear(width, hidden, bias=bias))
        self.add_module(down, nn.Linear(hidden, width, bias=bias))
        if fixup_bias:
            add_biases(self, ACT, OUT)

    blockir_context: ClassVar[frozenset[str]] = NOTHING

    def forward(self, x: Tensor, **ctx: object) -> Tensor:
        if self.fused:
            gate, up = getattr(self, self.names["gate_up"])(x).chunk(2, dim=-1)
        else:
            gate, up = getattr(self, self.names["gate"])(x), getattr(self, self.names["up"])(x)
        h = self.act(shift(gate, self, ACT)) * up
        return getattr(self, self.names["down"])(shift(h, self, OUT))

    def extra_repr(self) -> str:
        return f"act={self.act_name}"
