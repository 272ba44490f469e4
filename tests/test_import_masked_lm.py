"""`blockir import hf` of the masked-LM classes: the encoder under its attribute, the head HF stacks on it, and
the decoder's bias held as one tensor with the head's vector, as HF ties them."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

import blockir  # noqa: E402
from blockir.analyses.keys import param_keys  # noqa: E402
from blockir.api import hf_block_text as block_text  # noqa: E402
from blockir.importers.hf.more import MASKED  # noqa: E402

from hf_configs import MORE_CONFIGS  # noqa: E402

CASES = [pytest.param(t, True, id=t) for t in sorted(MASKED)] + \
    [pytest.param(t, False, id=f"{t}-untied") for t in ("bert", "electra")]


def _pair(model_type: str, tied: bool, exact: bool, tmp_path=None):
    cls = MASKED[model_type].cls
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**MORE_CONFIGS[model_type], architectures=[cls],
                                            tie_word_embeddings=tied)
    cfg._attn_implementation = "eager" if exact else "sdpa"
    real = getattr(transformers, cls)(cfg).eval()
    with torch.no_grad():  # HF starts the biases at zero, which would hide a bias read from the wrong tensor
        for p in real.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    program = blockir.parse(block_text(real.config.to_dict(), exact=exact), f"<{model_type}>")
    ours = blockir.compile(program, cls, seed=0).eval()
    return real, program, ours


def _run(model, model_type: str, real: bool):
    torch.manual_seed(1)
    ids = torch.randint(2, 97, (2, 7))
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, -2:] = 0
    model.zero_grad()
    types = {} if model_type == "distilbert" else {"token_type_ids": torch.zeros_like(ids)}
    out = model(input_ids=ids, attention_mask=keep, **types).logits if real else \
        model(ids, *types.values(), attention_mask=keep)
    out.pow(2).mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("model_type, tied", CASES)
def test_masked_lm_loads_strictly_and_matches_hf(model_type: str, tied: bool, tmp_path) -> None:
    real, program, ours = _pair(model_type, tied, exact=False)
    diagnostics = blockir.verify(program)
    assert not [d for d in diagnostics if d.is_error]
    if tied:  # untied, HF keeps the head's own vector beside the decoder's bias, and no code reads it
        assert not diagnostics, [str(d) for d in diagnostics]
    assert ours.load_state_dict(real.state_dict(), strict=True)
    real.save_pretrained(tmp_path)  # HF saves each tied tensor under one of its names
    saved = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    reloaded = blockir.compile(program, MASKED[model_type].cls, seed=1).eval()
    assert reloaded.load_state_dict(saved, strict=True)
    assert len(list(ours.parameters())) == len(list(real.parameters()))
    (ref, ref_g), (got, got_g) = _run(real, model_type, True), _run(ours, model_type, False)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6), (got - ref).abs().max()
    assert ref_g.keys() == got_g.keys()
    for n, g in ref_g.items():
        if g is None:  # untied, no code reads the head's own vector
            assert got_g[n] is None, n
            continue
        assert torch.allclose(got_g[n], g, rtol=1e-5, atol=1e-7), (n, (got_g[n] - g).abs().max())
    assert torch.equal(reloaded(*_inputs(model_type)), ours(*_inputs(model_type)))


def _inputs(model_type: str) -> tuple:
    ids = torch.arange(2, 16).reshape(2, 7)
    return (ids,) if model_type == "distilbert" else (ids, torch.zeros_like(ids))


def test_exact_mode_is_bit_exact_for_bert() -> None:
    real, _, ours = _pair("bert", True, exact=True)
    ours.load_state_dict(real.state_dict(), strict=True)
    (ref, ref_g), (got, got_g) = _run(real, "bert", True), _run(ours, "bert", False)
    assert torch.equal(got, ref)
    for n, g in ref_g.items():
        assert torch.equal(got_g[n], g), n


def test_the_shared_bias_is_one_tensor_and_the_keys_say_so() -> None:
    _, program, ours = _pair("bert", True, exact=False)
    head = ours.get_submodule("cls.predictions.decoder")
    assert head.bias is ours.get_parameter("cls.predictions.bias")
    assert head.weight is ours.get_parameter("bert.embeddings.word_embeddings.weight")
    aliases = param_keys(program, "BertForMaskedLM").aliases
    assert aliases == {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                       "cls.predictions.decoder.bias": "cls.predictions.bias"}


SOURCE = """dim B: batch
dim S: seq
dim D: model = 8
dim V: vocab = 11
model M(ids: [B, S]) -> [B, S, V] {{
  wte: embedding(V, D)
  scale: vector(D)
  out_bias: bias(V)
  lm_head: head(V, {args})
  return lm_head(scale * wte(ids))
}}
"""


@pytest.mark.parametrize("args, message, hint", [
    ("bias=true, shared_bias=out_bais", "'shared_bias' of 'lm_head' names no declaration of this block",
     "did you mean 'out_bias'?"),
    ("bias=true, shared_bias=scale", "'shared_bias' of 'lm_head' names 'scale', a scale declaration",
     "name a bias declaration"),
])
def test_a_shared_bias_names_a_bias_declaration_of_the_block(args: str, message: str, hint: str) -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(SOURCE.format(args=args), "m.block")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.hint, d.span.line) == ("E0126", message, hint, 9)


def test_a_head_without_a_bias_has_none_to_share() -> None:
    with pytest.raises(blockir.BlockError) as info:
        blockir.parse(SOURCE.format(args="shared_bias=out_bias"), "m.block")
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("E0119", "'shared_bias' contradicts bias=false: a head without a bias has none "
                                            "to share")
