"""What an op kind is, as questions code asks (``op.has(Normalizes)``) instead of lists of op classes.

Each kind states its traits once, in its own file under ``blockir/ops/``; analyses, verifiers,
passes and backends ask for a trait, so a new kind that states the right traits is understood by
every consumer without that consumer naming it.
"""
from __future__ import annotations


class Trait:
    """A marker: subclasses name one property an op kind has."""


class Source(Trait):
    """Defines a value from nothing the block computes (a block input, a zeros start)."""


class Sink(Trait):
    """Ends the block: returns values and defines none."""


class Normalizes(Trait):
    """Its (first) result is a norm declaration applied to a value; ``op.decl`` names the norm."""


class Calls(Trait):
    """Applies a declared branch, linear, activation declaration, extern, block or stack to ``op.args``."""


class ResidualSum(Trait):
    """Adds two tensors of one type: the residual add and what is fused with it."""


class Combines(Trait):
    """Elementwise of two tensor operands ``op.lhs``, ``op.rhs`` (add, sub, mul)."""


class Stochastic(Trait):
    """Draws random numbers in training (dropout, drop-path, layer drop); the identity in inference."""


class Modifier(Trait):
    """Passes one value through changing its scale, dtype or randomness only (cast, dropout, scale):
    what it returns is still the value it read, for every structural analysis."""


class Scales(Trait):
    """Multiplies its operand by a constant ``op.factor`` or a learned ``op.param``."""


class Learned(Trait):
    """Reads a learned parameter declaration of its own (``op.param``) besides its operands."""


class Elementwise(Trait):
    """Each output element depends only on the input elements at the same position."""


class RowLocal(Trait):
    """Each output row depends only on the same row of each input (no mixing across tokens)."""


class MultiResult(Trait):
    """May define more than one value (``op.results`` lists them in order)."""


class BlockInput(Trait):
    """Binds the block parameter ``op.result``; the block's signature prints it, not a statement."""


class AddNorm(Trait):
    """Sums ``op.shortcut`` and ``op.branch`` into ``op.residual`` and normalizes that into ``op.normalized``."""


class Product(Trait):
    """Multiplies two tensors elementwise, ``op.lhs * op.rhs``: a gate applied to a value."""


class Difference(Trait):
    """Subtracts two tensors, ``op.lhs - op.rhs``: a step from ``op.rhs`` toward ``op.lhs``."""


class Complement(Trait):
    """``1 - op.operand``: the complementary gate of a convex combination."""


class Function(Trait):
    """Applies the built-in function named ``op.fn`` to ``op.operand``."""


class Converts(Trait):
    """Changes only the dtype of ``op.operand``, to ``op.dtype``."""


class Concatenates(Trait):
    """Joins its operands ``op.args`` along the last axis into one wider value."""


class DropsLayer(Trait):
    """One draw per layer and step keeps or drops every update of the layer together (layer drop)."""
