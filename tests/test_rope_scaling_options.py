"""Dynamic and LongRoPE scaling: the tables against HF's rotary code call by call, and their arguments
(number lists, E0801, E0847, E0848)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from blockir.api import hf_block_text  # noqa: E402
from blockir.ir.printer import format_program  # noqa: E402
from blockir.lower.layers.rotary import DynamicFrequencies, RopeScaling, call_length, inv_freq, rope_cos_sin  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

HEAD_DIM = 16
SHORT, LONG = (1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0), (1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0)


def _hf(rope: dict, **config) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=dict(
        rope, rope_theta=10000.0), **config))


def _ours(scaling: RopeScaling, positions: torch.Tensor, state: DynamicFrequencies | None):
    grown = state.update(HEAD_DIM, 10000.0, positions.device, call_length(positions, positions.shape[1])) \
        if state else None
    return rope_cos_sin(positions.shape[1], HEAD_DIM, 10000.0, positions.device, torch.float32, scaling=scaling,
                        positions=positions, frequencies=grown)


@pytest.mark.parametrize("factor", [2.0, 1.3])
def test_dynamic_tables_follow_hf_call_by_call(factor: float) -> None:
    """Growth past the longest call, the grown base kept by shorter calls above the original context, and the
    return to the original base below it, bit for bit."""
    hf = _hf(dict(rope_type="dynamic", factor=factor), max_position_embeddings=8)
    scaling = RopeScaling("dynamic", factor, 8)
    state = DynamicFrequencies(scaling)
    x = torch.zeros(1, 1, HEAD_DIM)
    for start, length in ((0, 5), (0, 20), (19, 1), (4, 8), (20, 3), (0, 12), (0, 5), (3, 6)):
        positions = torch.arange(start, start + length)[None]
        want = hf(x, positions)
        got = _ours(scaling, positions, state)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (start, length)
    # the grown base is the NTK formula's: theta * (factor * n / max - factor + 1) ** (r / (r - 2))
    base = 10000.0 * (factor * 20 / 8 - factor + 1) ** (HEAD_DIM / (HEAD_DIM - 2))
    want = torch.tensor([base ** (-2 * i / HEAD_DIM) for i in range(HEAD_DIM // 2)], dtype=torch.float64)
    grown = inv_freq(HEAD_DIM, 10000.0, torch.device("cpu"), scaling, torch.tensor(20))
    torch.testing.assert_close(grown.double(), want, rtol=2e-6, atol=0)
    assert not torch.allclose(grown, inv_freq(HEAD_DIM, 10000.0, torch.device("cpu")), rtol=1e-2)


def test_longrope_tables_follow_hf_call_by_call() -> None:
    hf = _hf(dict(rope_type="longrope", short_factor=list(SHORT), long_factor=list(LONG),
                  original_max_position_embeddings=8), max_position_embeddings=32)
    scaling = RopeScaling("longrope", 4.0, 8, short_factor=SHORT, long_factor=LONG)
    assert scaling.table_factor() == hf.attention_scaling == math.sqrt(1 + math.log(4) / math.log(8))
    x = torch.zeros(1, 1, HEAD_DIM)
    for start, length in ((0, 8), (0, 9), (8, 1), (0, 3), (2, 7)):
        positions = torch.arange(start, start + length)[None]
        want, got = hf(x, positions), _ours(scaling, positions, None)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (start, length)
    short, long = (_ours(scaling, torch.arange(0, n)[None], None)[0][0, 7] for n in (8, 9))
    assert (short - long).abs().max() > 1e-2  # position 7 turns by the long factors once the call passes 8


HEAD = """dim B: batch
dim S: seq
dim D: model = 64
block Layer(x: [B, S, D]) -> [B, S, D] {{
  norm: rmsnorm(D)
  attn: self_attention(heads=4, rope=true, {args})
  h = x + attn(norm(x))
  return h
}}
"""
LONGROPE = "rope_scaling=longrope, rope_factor=4, rope_original_max=8"


def test_number_lists_round_trip_and_compile() -> None:
    args = f"rotary_dim=8, {LONGROPE}, rope_short_factor=[1, 1.5, 2e0, 3.25], rope_long_factor=[2, 4, 8, 16,], " \
           "rope_recache=true"
    program = blockir.parse(HEAD.format(args=args))
    assert blockir.verify(program) == []
    printed = format_program(program)
    assert "rope_short_factor=[1.0, 1.5, 2.0, 3.25], rope_long_factor=[2.0, 4.0, 8.0, 16.0]" in printed
    assert blockir.parse(printed) == program
    attn = blockir.compile(program, "Layer", seed=0).attn
    assert attn.rope_scaling == RopeScaling("longrope", 4.0, 8, short_factor=(1.0, 1.5, 2.0, 3.25),
                                            long_factor=(2.0, 4.0, 8.0, 16.0))
    assert attn.rope_recache


@pytest.mark.parametrize("args, code, message", [
    (f"{LONGROPE}, rope_long_factor=[1, 2, 3, 4, 5, 6, 7, 8]", "E0801",
     "rope_scaling=longrope of 'attn' needs rope_short_factor"),
    ("rope_scaling=dynamic, rope_factor=2", "E0801", "rope_scaling=dynamic of 'attn' needs rope_original_max"),
    ("rope_scaling=yarn, rope_factor=2, rope_original_max=8, rope_recache=true", "E0801",
     "rope_scaling=yarn of 'attn' does not read rope_recache"),
    (f"{LONGROPE}, rope_short_factor=[1, 2], rope_long_factor=[1, 2, 3, 4, 5, 6, 7, 8]", "E0847",
     "rope_short_factor of 'attn' has 2 factors for 16 rotated channels"),
    (f"rotary_dim=4, {LONGROPE}, rope_short_factor=[1, 2], rope_long_factor=[1, 0]", "E0848",
     "rope_long_factor of 'attn' holds 0; every factor must be positive"),
])
def test_scaling_arguments_that_do_not_fit(args: str, code: str, message: str) -> None:
    found = [(d.code, d.message, d.span.line) for d in blockir.verify(blockir.parse(HEAD.format(args=args)))]
    assert found == [(code, message, 6)]


def test_a_number_list_goes_only_where_one_is_taken() -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(HEAD.format(args=f"{LONGROPE}, rope_short_factor=2, rope_long_factor=[1]"))
    assert [(d.code, d.message) for d in info.value.diagnostics] == [
        ("E0107", "'rope_short_factor' must be a list of numbers [a, b, …]")]
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(HEAD.format(args="rope_factor=[1, 2]"))
    assert info.value.diagnostics[0].code == "E0111"


@pytest.mark.parametrize("key, short, long, at, message", [
    ("rope_scaling", [1, 2], [1, 2, 3, 4], "short_factor", "short_factor has 2 factors for the 4 rotated pairs"),
    ("rope_parameters", [1, 2, 3, 4], [1, 2, 3, 4, 5], "long_factor", "long_factor has 5 factors for the 4 rotated"),
])
def test_imported_longrope_factors_must_match_the_rotated_pairs(key, short, long, at, message) -> None:
    """Phi-3 with 16-channel heads rotating half of them: four factors per list, refused at the list otherwise."""
    config = dict(model_type="phi3", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                  num_attention_heads=4, partial_rotary_factor=0.5, original_max_position_embeddings=8, pad_token_id=0,
                  **{key: dict(rope_type="longrope", short_factor=short, long_factor=long)})
    with pytest.raises(blockir.BlockError) as info:
        hf_block_text(config)
    (d,) = info.value.diagnostics
    assert (d.code, d.span.filename) == ("E0809", f"<hf config>: $.{key}.{at}")
    assert d.message.startswith(message)
