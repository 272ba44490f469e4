"""Every family the HF importer writes derives a tensor-parallel plan in every layout, or is refused for a reason
stated here (no torch: the plan is derived from the written `.block` text).

Each tiny config of ``hf_configs`` is written, parsed and planned over 2 and 4 ranks in the replicated, sequence,
hidden and context layouts, with and without vocabulary parallelism. A plan that derives has placed every state_dict key
(``derive_plan`` checks that itself); one that does not must raise the ``BlockError`` this file's ``REFUSED`` lists for
that family, and nothing else (a KeyError or StopIteration is a bug). ``docs/distributed.md`` mirrors the table.
"""
from __future__ import annotations

import re

import pytest

import blockir
from blockir.analyses.parallel import derive_plan
from blockir.analyses.sizes import Sizes
from blockir.analyses.summaries import called_blocks
from blockir.api import hf_block_text
from conftest import ROOT
from hf_configs import CONFIGS, MORE_CONFIGS

WORLDS = (2, 4)
DIMS = {"B": 2, "S": 8}
# What the tiny configs would refuse for their sizes alone, not for their family: a vocabulary of 97 rows splits over
# no degree (real vocabularies are padded, Megatron-LM to a multiple of 128 times the degree), and BLOOM's 6 heads
# split over 2 ranks but not 4 (BLOOM's released sizes have 16 to 112 heads)
VARIANTS: dict[str, dict] = {"bloom": dict(n_head=4)}
PADDED_VOCAB = 96
FAMILIES = {**CONFIGS, **MORE_CONFIGS}
# the tensor-parallel layouts and the context layout (its refusals of other blocks are tests/test_context_plan.py's)
LAYOUTS = ("replicated", "sequence", "hidden", "context")

# family → (degrees it is refused at, code, reason); every layout and both vocab settings alike: none is today
REFUSED: dict[str, tuple[tuple[int, ...], str, str]] = {}


def _config(name: str) -> dict:
    return dict(FAMILIES[name], vocab_size=PADDED_VOCAB, **VARIANTS.get(name, {}))


def _top(program: blockir.ir.program.Program) -> blockir.ir.program.Block:
    """The model block: the one no other block instantiates (the importer writes it last)."""
    return [b for b in program.blocks if b.name not in called_blocks(program)][-1]


def _outcome(program, block, world: int, layout: str, vocab: bool) -> str | None:
    """None when the plan derives, else the refusal's code."""
    try:
        derive_plan(program, block, Sizes.of(program, DIMS), layout, world, vocab=vocab)
    except blockir.BlockError as e:
        (d,) = e.diagnostics
        assert d.span is not None and d.span.line > 0 and d.hint, d  # located, with a way out
        return d.code
    return None


def cell(name: str) -> str:
    """The docs table's cell for a family in any layout."""
    if name not in REFUSED:
        return "derives"
    worlds, code, reason = REFUSED[name]
    at = "" if worlds == WORLDS else f" at {', '.join(map(str, worlds))} ranks"
    return f"{code}{at}: {reason}"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_derives_or_is_refused_as_listed(name: str) -> None:
    text = hf_block_text(_config(name))
    program = blockir.parse(text, f"{name}.block")
    block = _top(program)
    worlds, code, _ = REFUSED.get(name, ((), None, ""))
    for world in WORLDS:
        for layout in LAYOUTS:
            for vocab in (False, True):
                expected = code if world in worlds else None
                assert _outcome(program, block, world, layout, vocab) == expected, (world, layout, vocab)


def test_the_refusals_name_only_families_the_importer_writes() -> None:
    assert set(REFUSED) <= set(FAMILIES)


def test_a_token_type_table_stays_replicated_under_vocab_parallelism() -> None:
    """BERT's token-type table (2 rows) is not a vocabulary: only the word table is split."""
    program = blockir.parse(hf_block_text(_config("bert")), "bert.block")
    plan = derive_plan(program, _top(program), Sizes.of(program, DIMS), "sequence", 4, vocab=True)
    assert plan.params["embeddings.word_embeddings.weight"] == "shard(0)"
    assert plan.params["embeddings.token_type_embeddings.weight"] == "replicate"
    assert plan.styles()["embeddings.token_type_embeddings"] == "embedding"


def test_a_head_after_a_narrower_projection_gathers_its_own_width() -> None:
    """OPT with word_embed_proj_dim=32 under a 64-wide stream: the head's input is all-gathered at 32 features."""
    program = blockir.parse(hf_block_text(_config("opt-post-ln")), "opt.block")
    for vocab in (False, True):
        plan = derive_plan(program, _top(program), Sizes.of(program, DIMS), "sequence", 2, vocab=vocab)
        assert [(c.op, c.elements) for c in plan.collectives[""] if c.site == "lm_head"] == [("all-gather", 2 * 8 * 32)]
        table = [(c.op, c.elements) for c in plan.collectives[""] if c.site == "model.decoder.embed_tokens"]
        assert table == ([("reduce-scatter", 2 * 8 * 32)] if vocab else [])


def test_a_norm_on_a_narrower_stream_sums_over_the_streams_rows() -> None:
    """ELECTRA's embedding LayerNorm over 32 features before its projection to the 64-wide stream, feature-sharded:
    one all-reduce of Σx and Σx² per row, 2·B·S elements, forward and backward, and its gain's and shift's slices
    gathered (32 features each)."""
    program = blockir.parse(hf_block_text(_config("electra")), "electra.block")
    plan = derive_plan(program, _top(program), Sizes.of(program, DIMS), "hidden", 2)
    rows = 2 * 2 * 8
    assert [(c.op, c.elements) for c in plan.collectives[""] if c.site == "embeddings.LayerNorm"] == [("all-reduce", rows)]
    assert [(c.op, c.elements) for c in plan.backward[""] if c.site == "embeddings.LayerNorm"] == \
        [("all-reduce", rows), ("all-gather", 32), ("all-gather", 32)]


def _docs_table() -> dict[str, tuple[str, ...]]:
    text = (ROOT / "docs" / "distributed.md").read_text()
    section = text.split("### Families the importer writes", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        if m := re.match(r"\| `([^`]+)` \|(.*)\|$", line):
            rows[m.group(1)] = tuple(c.strip() for c in m.group(2).split("|"))
    return rows


def test_the_docs_table_mirrors_the_sweep() -> None:
    expected = {name: (cell(name),) * len(LAYOUTS) for name in FAMILIES}
    assert _docs_table() == expected
