"""RoPE: inverse frequencies, unscaled and under the context-extension schemes checkpoints ship with;
the cos/sin tables built from them (``rope_cos_sin``) and the rotation of queries and keys (``apply_rope``).

Each scheme is computed in fp32 in the order HF transformers' ``modeling_rope_utils`` uses, so the
tables of an imported model equal the host model's bit for bit:

* ``linear``: position interpolation, every frequency divided by ``factor``
  ("Extending Context Window of Large Language Models via Positional Interpolation", arXiv:2306.15595).
* ``llama3``: low frequencies divided by ``factor``, high ones kept, a smooth ramp between
  (Llama 3.1's scheme; "The Llama 3 Herd of Models", arXiv:2407.21783).
* ``yarn``: per-dimension blend of interpolated and original frequencies with the cos/sin tables
  scaled by an attention factor ("YaRN: Efficient Context Window Extension of Large Language
  Models", arXiv:2309.00071).
* ``dynamic``: NTK-aware scaling whose base grows with the longest sequence seen past the original
  context, recomputed as the sequence grows (HF's ``dynamic_rope_update``), so earlier keys keep the
  frequencies they were rotated with (:class:`DynamicFrequencies`).
* ``longrope``: one factor per frequency, a short set within the original context and a long set past
  it, chosen per call by the longest position, with the tables scaled by an attention factor
  (Phi-3; "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens", arXiv:2402.13753).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

SCALINGS = ("linear", "llama3", "yarn", "dynamic", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """A scheme and its parameters; unset ones take the defaults of the published configs."""

    kind: str
    factor: float
    original_max: int | None = None  # the pre-extension context (llama3, yarn, longrope; dynamic: where it starts)
    low_freq: float = 1.0  # llama3
    high_freq: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: unset 0.1 ln(factor) + 1; longrope: unset sqrt(1 + ln f / ln max)
    short_factor: tuple[float, ...] = ()  # longrope, one per frequency
    long_factor: tuple[float, ...] = ()  # longrope

    @property
    def by_length(self) -> bool:
        """Its frequencies depend on the call's longest position (``call_length``)."""
        return self.kind in ("dynamic", "longrope")

    def table_factor(self) -> float:
        """What the cos/sin tables are multiplied by (one for every scheme but YaRN and LongRoPE)."""
        if self.kind not in ("yarn", "longrope"):
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.factor <= 1:
            return 1.0
        if self.kind == "yarn":
            return 0.1 * math.log(self.factor) + 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max))


def inv_freq(dim: int, theta: float, device: torch.device, scaling: RopeScaling | None = None,
             seq_len: Tensor | None = None) -> Tensor:
    """The ``dim // 2`` inverse frequencies of ``dim`` rotated coordinates, in fp32.

    ``seq_len`` (a 0-dim integer tensor, the longest position plus one) picks LongRoPE's factor set and
    grows the dynamic base; unset, both schemes give their frequencies within the original context.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    if scaling is not None and scaling.kind == "longrope":
        long = seq_len is not None and bool(seq_len > scaling.original_max)
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32,
                               device=device)
        return 1.0 / (factors * theta ** exponents)
    if scaling is not None and scaling.kind == "dynamic":
        return _dynamic(dim, theta, exponents, scaling, seq_len)
    base = 1.0 / (theta ** exponents)
    if scaling is None:
        return base
    if scaling.kind == "linear":
        return base / scaling.factor
    if scaling.kind == "llama3":
        return _llama3(base, scaling)
    return _yarn(dim, theta, exponents, scaling)


def _dynamic(dim: int, theta: float, exponents: Tensor, s: RopeScaling, seq_len: Tensor | None) -> Tensor:
    # unset: the original context's base in Python floats; else a 0-dim f32 base from the tensor length, each
    # computed as HF computes it, so the rounding is the host's
    longest: float | Tensor = s.original_max
    if seq_len is not None:
        longest = torch.maximum(seq_len, torch.tensor(s.original_max, dtype=seq_len.dtype, device=seq_len.device))
    base = theta * ((s.factor * longest / s.original_max) - (s.factor - 1)) ** (dim / (dim - 2))
    if isinstance(base, Tensor):
        base = base.to(exponents.device)
    return 1.0 / (base ** exponents)


class DynamicFrequencies:
    """The dynamic scheme's state between calls, as HF's rotary module keeps it: the longest sequence seen
    (never below the original context) and the frequencies grown for it. A call past it grows them; a call
    back below the original context after growing returns to the original frequencies."""

    def __init__(self, scaling: RopeScaling) -> None:
        self.scaling, self.longest, self.grown = scaling, scaling.original_max, None  # type: ignore[assignment]

    def update(self, dim: int, theta: float, device: torch.device, seq_len: Tensor) -> Tensor | None:
        """The grown frequencies a call of ``seq_len`` (``call_length``) rotates by, or None for the original
        ones."""
        longest, original = self.longest, self.scaling.original_max
        if seq_len > longest:
            self.grown = inv_freq(dim, theta, device, self.scaling, seq_len)
            self.longest = seq_len
        if seq_len < original and longest > original:
            self.grown, self.longest = None, original
        return self.grown


def call_length(positions: Tensor | None, seq: int) -> Tensor:
    """The longest position of a call plus one, which the dynamic and LongRoPE schemes scale by (HF's
    ``max(position_ids) + 1``): of the positions given, else of ``0..seq-1``. A caller holding a slice of the
    rows (context parallelism) passes the whole call's positions."""
    return positions.max() + 1 if positions is not None else torch.tensor(seq)


def _llama3(freqs: Tensor, s: RopeScaling) -> Tensor:
    old = s.original_max
    low_wavelen, high_wavelen = old / s.low_freq, old / s.high_freq
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / s.factor, freqs)
    smooth = (old / wavelen - s.low_freq) / (s.high_freq - s.low_freq)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(dim: int, theta: float, exponents: Tensor, s: RopeScaling) -> Tensor:
    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(s.beta_fast)), 0)
    high = min(math.ceil(correction_dim(s.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    pos_freqs = theta ** exponents
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp.to(pos_freqs.device)
    return (1.0 / (s.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype,
    interleaved: bool = False, freqs_dtype: torch.dtype | None = None, scaling: RopeScaling | None = None,
    positions: Tensor | None = None, frequencies: Tensor | None = None, length: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """RoPE tables for positions ``0..seq_len-1``, shaped ``[1, S, head_dim]`` like HF's.

    Frequencies and angles are computed in fp32 and only the tables are cast,
    which is what the HF rotary module does, so both routes agree exactly.
    ``head_dim`` is the number of rotated coordinates (smaller under partial rotary).
    ``freqs_dtype`` first rounds the inverse frequencies to that dtype: an HF rotary
    module's ``inv_freq`` buffer after ``model.to(dtype)``, whose angles then differ in bf16.
    ``scaling`` is a context-extension scheme (see above). ``positions`` (``[B or 1, S]``, HF's
    ``position_ids``) replaces ``0..seq_len-1``; the tables are then ``[B or 1, S, head_dim]``.
    ``frequencies`` are ones a dynamic scheme grew (:class:`DynamicFrequencies`): used as they are, in
    f32, as HF registers them. ``length`` is the call's ``call_length``, which picks LongRoPE's factors: unset,
    that of ``positions``.
    """
    if frequencies is None:
        longest = None
        if scaling is not None and scaling.kind == "longrope":
            longest = length if length is not None else call_length(positions, seq_len)
        frequencies = inv_freq(head_dim, theta, device, scaling, longest)
        if freqs_dtype is not None:
            frequencies = frequencies.to(freqs_dtype).float()
    frequencies = frequencies.to(device)  # grown ones stay where they were made, as HF's plain attribute does
    if positions is None:
        freqs = torch.arange(seq_len, device=device, dtype=torch.float32)[None, :, None] * frequencies
    else:
        freqs = positions.to(device=device, dtype=torch.float32)[:, :, None] * frequencies
    angles = freqs.repeat_interleave(2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    factor = scaling.table_factor() if scaling is not None else 1.0
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return cos.to(dtype), sin.to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: Tensor) -> Tensor:
    """(x0, x1, x2, x3, …) -> (-x1, x0, -x3, x2, …): GPT-J's rotate-every-two."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, rotary: int | None = None) -> Tensor:
    """Rotate the first ``cos.shape[-1]`` coordinates of ``x`` [B, H, S, hd] by tables [B or 1, S, rd].

    Rotate-half pairs coordinate ``i`` with ``i + rd/2`` (the layout HF LLaMA-style
    checkpoints' q/k weights assume); interleaved pairs ``2i`` with ``2i + 1`` (GPT-J).
    The remaining coordinates pass through (partial rotary, GPT-NeoX and Phi).
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    turn = _rotate_pairs if interleaved else _rotate_half
    if rotary is None:  # a module passes its own widths, so that symbolic tracing meets no shape test
        return x * cos + turn(x) * sin
    rot, rest = x[..., :rotary], x[..., rotary:]
    return torch.cat((rot * cos + turn(rot) * sin, rest), dim=-1)
