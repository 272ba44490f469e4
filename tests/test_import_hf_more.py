"""`blockir import hf` for encoders and learned-position decoders: tiny random HF models, logits and every gradient."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from blockir.cli import main  # noqa: E402
from blockir.api import hf_block_text as block_text  # noqa: E402
from blockir.importers.hf.more import ENCODERS  # noqa: E402
from blockir.ir.printer import format_program  # noqa: E402

from hf_configs import COMMON  # noqa: E402
from hf_configs import MORE_CONFIGS as CONFIGS  # noqa: E402

DECODERS = {"opt", "opt-post-ln", "bloom", "gpt_bigcode", "gpt_bigcode-mha", "biogpt", "gpt_neo", *(t for t in CONFIGS
                                                                                          if t.startswith("falcon"))}
EAGER_ONLY = {"bloom", "gpt_neo"}  # transformers has only the eager attention for these: the fast path is compared with it


def _real(model_type: str, dtype: torch.dtype, attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**CONFIGS[model_type])
    cfg._attn_implementation = "eager" if model_type in EAGER_ONLY else attn
    if model_type in DECODERS:
        return transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    pooler = {"add_pooling_layer": False} if model_type in ENCODERS and model_type != "electra" else {}
    return transformers.AutoModel.from_config(cfg, **pooler).to(dtype).eval()


def _pair(model_type: str, dtype: torch.dtype, exact: bool):
    real = _real(model_type, dtype, "eager" if exact else "sdpa")
    text = block_text(real.config.to_dict(), exact=exact)
    program = blockir.parse(text, f"<{model_type}>")
    assert not [d for d in blockir.verify(program) if d.is_error]
    name = type(real).__name__
    ours = blockir.compile(program, name, dtype=dtype, seed=0).eval()
    ours.load_state_dict(real.state_dict(), strict=True)
    assert blockir.reconcile(program, name, real.state_dict()).ok
    return real, ours


def _run(model, model_type: str, real: bool):
    torch.manual_seed(1)
    ids = torch.randint(2, 97, (2, 7))  # no pad token: RoBERTa's positions count from pad_token_id + 1
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, -2:] = 0
    model.zero_grad()
    if real and model_type in DECODERS:  # HF's default call: its KV cache lays out the keys (kv_cache=true)
        out = model(input_ids=ids, attention_mask=keep).logits
    elif real:
        out = model(input_ids=ids, attention_mask=keep).last_hidden_state
    elif model_type in DECODERS or model_type == "distilbert":
        out = model(ids, attention_mask=keep)
    else:
        out = model(ids, torch.zeros_like(ids), attention_mask=keep)  # HF's default token types
    out.float().pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_fast_path_matches(model_type: str) -> None:
    real, ours = _pair(model_type, torch.float32, exact=False)
    (ref, ref_g), (got, got_g) = _run(real, model_type, True), _run(ours, model_type, False)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6), (got - ref).abs().max()
    assert ref_g.keys() == got_g.keys()
    for n, g in ref_g.items():
        assert torch.allclose(got_g[n], g, rtol=1e-5, atol=1e-7), (n, (got_g[n] - g).abs().max())


# written by RoBERTa's writer under other class names: the fast path and the printer cover them
SAME_AS_ROBERTA = {"xlm-roberta", "camembert"}
EXACT = [pytest.param(t, dt, id=f"{t}-{name}") for t in sorted(CONFIGS) if t not in SAME_AS_ROBERTA
         for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16"))]


@pytest.mark.parametrize("model_type, dtype", EXACT)
def test_exact_mode_is_bit_exact(model_type: str, dtype: torch.dtype) -> None:
    real, ours = _pair(model_type, dtype, exact=True)
    (ref, ref_g), (got, got_g) = _run(real, model_type, True), _run(ours, model_type, False)
    assert torch.equal(got, ref), (got.float() - ref.float()).abs().max()
    for n, g in ref_g.items():
        assert torch.equal(got_g[n], g), (n, (got_g[n].float() - g.float()).abs().max())


@pytest.mark.parametrize("installed", [(5, 24, 0), (5, 25, 0), None])
def test_falcons_exact_attention_follows_the_installed_transformers(installed, monkeypatch) -> None:
    """Before 5.25 Falcon's own op divided the scores, took the softmax in the input's dtype, broadcast the one
    key/value head before rotating and dropped nothing; from 5.25 (and with none installed) it is the shared
    eager op, the config's attention dropout included."""
    from blockir.importers.hf import versions
    monkeypatch.setattr(versions, "_installed", lambda: installed)
    text = block_text(dict(CONFIGS["falcon-new-mqa"], attention_dropout=0.1), exact=True)
    (attn,) = [line for line in text.splitlines() if ": self_attention(" in line]
    old = installed == (5, 24, 0)
    assert [flag in attn for flag in ("divide_scores=true", "softmax_f32=false", "kv_broadcast=true")] == [old] * 3
    assert ("dropout=0.1" in attn) != old


def test_roberta_positions_start_after_the_pad_row() -> None:
    text = block_text(CONFIGS["roberta"])
    assert "embeddings.position_embeddings: embedding(P, D, positions=true, position_offset=2)" in text
    assert "positions=true)" in block_text(CONFIGS["bert"])


def test_diff_bert_roberta_names_what_differs(tmp_path, capsys) -> None:
    """Same keys and shapes; the one difference is where the position lookup starts (RoBERTa skips the pad row).
    Both get pad token 1: their config classes default to different ones, which the token tables carry."""
    files = []
    for model_type in ("bert", "roberta"):
        path = tmp_path / f"{model_type}.block"
        path.write_text(block_text(dict(COMMON, model_type=model_type, pad_token_id=1)), encoding="utf-8")
        files.append(str(path))
    assert main(["diff", *files, "--block", "BertModel", "--block-b", "RobertaModel", "--format", "json"]) == 1
    [report] = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "same parameter keys and shapes, different function"
    assert report["same_keys"] and not report["signature_changed"]
    assert report["first_a"]["op"] == report["first_b"]["op"] == "%2 = embeddings.position_embeddings(input_ids)"
    assert report["first_a"]["location"].endswith("bert.block:32:11")


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_imported_file_round_trips_through_the_printer(model_type: str) -> None:
    """Dotted layer names and the new attention and embedding arguments print and parse back unchanged."""
    program = blockir.parse(block_text(CONFIGS[model_type]), f"<{model_type}>")
    printed = format_program(program)
    again = blockir.parse(printed, "printed.block")
    assert again == program
    assert format_program(again) == printed


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_alibi_attention_matches_a_float64_oracle(impl: str) -> None:
    """ALiBi (arXiv:2108.12409) with grouped key/value heads, a window and padding, against the equations."""
    from blockir.lower.layers.attention import SelfAttention

    torch.manual_seed(0)
    attn = SelfAttention(32, 4, kv_heads=2, alibi=True, bias=True, core=None).double()
    attn.core.window, attn.core.impl = 3, impl
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    keep = torch.ones(2, 6, dtype=torch.long)
    keep[1, -2:] = 0
    got = attn(x, attention_mask=keep)

    q = attn.q_proj(x).view(2, 6, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(2, 6, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    v = attn.v_proj(x).view(2, 6, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], dtype=torch.float64)
    positions = (keep.cumsum(-1) - 1) * keep  # a key's position counts the kept keys before it
    scores = q @ k.transpose(-1, -2) / 8 ** 0.5 + slopes[None, :, None, None] * positions[:, None, None, :]
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    allowed = (j <= i) & (i - j < 3) & keep.bool()[:, None, None, :]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    want = attn.o_proj((probs @ v).transpose(1, 2).reshape(2, 6, 32))
    tol = 1e-6 if impl == "eager" else 1e-12  # the eager path takes its softmax in f32, as BLOOM's code does
    assert torch.allclose(got, want, rtol=tol, atol=tol), (got - want).abs().max()
