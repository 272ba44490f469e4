"""The one module every norm family compiles to: its family's state, settings and forward.

A ``Norm`` holds its settings as plain attributes, registers the parameters, buffers and children its
family's ``state`` asks for (each gain and shift under the key the declaration names), and runs the
family's ``forward``. A family whose forward is one function (``math``) is recorded by
``torch.fx.symbolic_trace`` as one call, as ``F.layer_norm`` is, instead of being traced into the
dtype checks that pick its cast order; any other family's forward is recorded as one call of
``family_forward`` on the module, since its moments depend on the mask and its state.
"""
from __future__ import annotations

import sys
from functools import partial
from typing import Any, Callable, Mapping

import torch
from torch import Tensor, nn

from blockir.lower.layers.numerics import meeting
from blockir.norms import FAMILIES, NormFamily, family, family_named
from blockir.norms.base import Defaults, Value, plain

# each family's math as a name of this module, where fx patches it while tracing (read through the module
# object, which torch.compile follows as well)
_HERE = sys.modules[__name__]
for _family in FAMILIES.values():
    if _family.math is not None:
        globals()[_family.math.__name__] = _family.math
        torch.fx.wrap(_family.math.__name__)


def family_forward(x: Tensor, attention_mask: object, module: "Norm") -> Tensor:
    """The forward of a family written against its module (batch moments, a transition's step)."""
    return module.family.forward(module, x, attention_mask)


torch.fx.wrap("family_forward")


class Norm(nn.Module):
    """A norm of one family over a width-``width`` last axis."""

    keys: Mapping[str, str] = {}  # role -> key, for the families whose declarations rename their parameters

    def __init__(self, family: NormFamily, width: int, settings: Mapping[str, Any]) -> None:
        super().__init__()
        # plain settings straight to __dict__: nn.Module.__setattr__ costs ~1.5 µs each, paid per layer
        vars(self).update(settings)
        vars(self).update(family=family, width=width)
        if family.context:
            self.blockir_context = family.context
        family.state(self, width)

    def parameter(self, role: str, value: Tensor | None) -> None:
        """Register the parameter of ``role`` under the key the declaration gives it (``weight_name=g``)."""
        self.register_parameter(self.keys.get(role, role), nn.Parameter(value) if value is not None else None)

    def param(self, role: str) -> nn.Parameter | None:
        return self._parameters.get(self.keys.get(role, role))

    def met(self, role: str, x: Tensor) -> Tensor | None:
        """The parameter of ``role`` as it meets ``x`` (a rank's local part of a distributed one)."""
        return meeting(self.param(role), x)

    def child(self, name: str, family: NormFamily, settings: Mapping[str, Any]) -> None:
        self.add_module(name, Norm(family, self.width, settings))

    def forward(self, x: Tensor, attention_mask: object = None, **_: Any) -> Tensor:
        math = self.family.math
        if math is None:
            return _HERE.family_forward(x, attention_mask, self)
        return getattr(_HERE, math.__name__)(x, *self.family.arguments(self, x))

    def _get_name(self) -> str:
        return self.family.module_name

    def extra_repr(self) -> str:
        return self.family.describe(self)


def norm_factory(decl: Any, width: int, value: Value) -> Callable[[], Norm]:
    """The constructor of one norm declaration's module, its arguments evaluated now (``value``)."""
    fam = family(decl)
    return partial(Norm, fam, width, fam.settings(decl, value))


def make_norm(name: str, width: int, **given: Any) -> Norm:
    """A module of family ``name`` with its declaration's defaults, but for the arguments ``given`` that it has."""
    fam = family_named(name)
    own = {a.name for a in fam.args}
    return Norm(fam, width, fam.settings(Defaults(fam, {k: v for k, v in given.items() if k in own}), plain))
