"""`blockir import hf`: tiny random HF models from configs, compiled without bind, compared on logits and gradients."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import blockir  # noqa: E402
from blockir.api import hf_block_text as block_text  # noqa: E402

from hf_configs import CONFIGS  # noqa: E402

EAGER_ONLY = {"gemma2", "vaultgemma"}  # HF refuses SDPA for soft-capped attention: eager is the reference
CLASSES = {"gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM"}


def _class_name(model_type: str) -> str:
    return CLASSES.get(model_type) or next(line.split()[1] for line in block_text(CONFIGS[model_type]).splitlines()
                                           if line.startswith("model ")).split("(")[0]


def _real(model_type: str, dtype: torch.dtype, attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**CONFIGS[model_type])
    cfg._attn_implementation = "eager" if model_type in EAGER_ONLY else attn
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).eval()
    return model


def _pair(model_type: str, dtype: torch.dtype, exact: bool):
    real = _real(model_type, dtype, "eager" if exact else "sdpa")
    text = block_text(real.config.to_dict(), exact=exact)
    program = blockir.parse(text, f"<{model_type}>")
    assert not [d for d in blockir.verify(program) if d.is_error]
    name = _class_name(model_type)
    ours = blockir.compile(program, name, dtype=dtype, seed=0).eval()
    ours.load_state_dict(real.state_dict(), strict=True)
    report = blockir.reconcile(program, name, real.state_dict())
    assert report.ok, str(report)
    return real, ours


def _inputs():
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (2, 7))
    ids[0, 1], ids[1, 2] = 0, 1  # pad ids in the text: nn.Embedding's padding_idx row gets no gradient
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, -2:] = 0  # right padding: the padded keys are masked, the real positions stay comparable
    return ids, keep


def _run(model, ids, keep, real: bool):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=keep).logits if real else model(ids, attention_mask=keep)
    out.float().pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out.detach(), grads


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_fast_path_matches(model_type: str) -> None:
    real, ours = _pair(model_type, torch.float32, exact=False)
    ids, keep = _inputs()
    ref, ref_g = _run(real, ids, keep, True)
    got, got_g = _run(ours, ids, keep, False)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), (got - ref).abs().max()
    for n, g in ref_g.items():
        assert torch.allclose(got_g[n], g, rtol=1e-4, atol=1e-6), (n, (got_g[n] - g).abs().max())


EXACT = [pytest.param(t, dt, id=f"{t}-{name}") for t in sorted(CONFIGS)
         for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16"))]


@pytest.mark.parametrize("model_type, dtype", EXACT)
def test_exact_mode_is_bit_exact(model_type: str, dtype: torch.dtype) -> None:
    real, ours = _pair(model_type, dtype, exact=True)
    ids, keep = _inputs()
    ref, ref_g = _run(real, ids, keep, True)
    got, got_g = _run(ours, ids, keep, False)
    assert torch.equal(got, ref), (got.float() - ref.float()).abs().max()
    for n, g in ref_g.items():
        assert torch.equal(got_g[n], g), (n, (got_g[n].float() - g.float()).abs().max())


@pytest.mark.parametrize("config, message", [
    (dict(CONFIGS["granite"], logits_scaling=3.0), "logits_scaling=3 is not a power of two"),
    (dict(CONFIGS["gemma2"], layer_types=["sliding_attention", "full_attention", "full_attention"]),
     "this mix of sliding and full attention layers is not supported"),
    (dict(CONFIGS["olmo"], clip_qkv=8.0), "clip_qkv (clamping q, k and v) is not supported"),
    (dict(CONFIGS["smollm3"], num_hidden_layers=3, no_rope_layers=[1, 0, 0]),
     "this mix of layers with and without RoPE is not supported"),
    (dict(CONFIGS["llama"], rope_parameters=dict(rope_type="proportional", rope_theta=1e4)),
     "RoPE scaling type 'proportional' is not supported"),
    (dict(CONFIGS["llama"], model_type="hunyuan_v1_dense"), "model type 'hunyuan_v1_dense' is not supported: its "
     "q/k RMSNorms (query_layernorm, key_layernorm) act after RoPE; the language's qk_norm acts before"),
])
def test_what_the_file_cannot_state_is_refused(config: dict, message: str) -> None:
    with pytest.raises(blockir.BlockError) as info:
        block_text(config)
    (d,) = info.value.diagnostics
    assert (d.code, d.message) == ("E0800", message)


def test_alternating_layer_types_become_a_window_in_layer() -> None:
    text = block_text(dict(CONFIGS["gemma2"], layer_types=["full_attention", "sliding_attention", "full_attention"]))
    assert "window=3 * (1 - (-1) ** layer) / 2" in text
    model = blockir.compile(blockir.parse(text), "Gemma2ForCausalLM", seed=0)
    assert [layer.self_attn.core.window for layer in model.model.layers] == [None, 3, None]


@pytest.mark.parametrize("model_type, types, windows, thetas", [
    ("gemma3_text", ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"], [3] * 5 + [None, 3],
     [10000.0] * 5 + [1e6, 10000.0]),
    ("cohere2", ["sliding_attention"] * 3 + ["full_attention", "sliding_attention"], [3, 3, 3, None, 3],
     [10000.0] * 5),
])
def test_periodic_layer_types_become_an_indicator_in_layer(model_type, types, windows, thetas) -> None:
    """One full layer every period: the window, Gemma 3's local RoPE base and Cohere 2's RoPE follow the indicator."""
    text = block_text(dict(CONFIGS[model_type], layer_types=types))
    period = len(types) - types[::-1].index("full_attention")
    assert f"(((layer + 1) % {period} + {period - 1}) // {period})" in text
    model = blockir.compile(blockir.parse(text), _class_name(model_type), seed=0)
    layers = list(model.model.layers)
    assert [layer.self_attn.core.window for layer in layers] == windows
    assert [layer.self_attn.rope_theta for layer in layers] == thetas
    rotated = [layer.self_attn.rotary_dim for layer in layers]
    assert rotated == ([16] * 7 if model_type == "gemma3_text" else [16, 16, 16, 0, 16])


def test_layers_without_rope_rotate_nothing_and_slide() -> None:
    """SmolLM3: every third layer has no RoPE (no_rope_layer_interval=3) and, with use_sliding_window, a window."""
    text = block_text(CONFIGS["smollm3-nope"])
    assert "rotary_dim=16 * (((layer + 1) % 3 + 2) // 3), window=3 * (1 - (((layer + 1) % 3 + 2) // 3))" in text
    layers = list(blockir.compile(blockir.parse(text), "SmolLM3ForCausalLM", seed=0).model.layers)
    assert [layer.self_attn.rotary_dim for layer in layers] == [16, 16, 0, 16]
    assert [layer.self_attn.core.window for layer in layers] == [None, None, 3, None]


def test_cohere2_full_layers_alone_rotate_nothing() -> None:
    """HF's Cohere 2 applies RoPE only on layers with a window: all-full layers rotate nothing."""
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**dict(CONFIGS["cohere2"], layer_types=["full_attention"] * 5))
    cfg._attn_implementation = "eager"
    real = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    model = blockir.compile(blockir.parse(block_text(real.config.to_dict(), exact=True)), "Cohere2ForCausalLM")
    model.load_state_dict(real.state_dict(), strict=True)
    ids, keep = _inputs()
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=keep), real(input_ids=ids, attention_mask=keep).logits)


@pytest.mark.parametrize("model_type", ["ernie4_5", "exaone4", "internlm3", "llama", "qwen2", "gemma2", "olmo2",
                                        "starcoder2", "cohere2", "smollm3"])
def test_a_rotary_embedding_that_turns_every_channel_ignores_partial_rotary_factor(model_type: str) -> None:
    """These classes' RoPE reads no partial_rotary_factor: HF rotates the whole head whatever the config says."""
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(**dict(CONFIGS[model_type], partial_rotary_factor=0.5))
    cfg._attn_implementation = "eager"
    real = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    assert real.config.rope_parameters["partial_rotary_factor"] == 0.5
    model = blockir.compile(blockir.parse(block_text(real.config.to_dict(), exact=True)), _class_name(model_type))
    model.load_state_dict(real.state_dict(), strict=True)
    ids, keep = _inputs()
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=keep), real(input_ids=ids, attention_mask=keep).logits)


def test_a_layer_mix_without_a_period_is_refused() -> None:
    with pytest.raises(blockir.BlockError) as info:
        block_text(dict(CONFIGS["cohere2"], layer_types=["sliding_attention", "full_attention", "full_attention",
                                                         "sliding_attention", "full_attention"]))
    assert info.value.diagnostics[0].message == "this mix of sliding and full attention layers is not supported"


@pytest.mark.parametrize("model_type", ["gptj", "codegen", "gemma3_text", "cohere2", "cohere", "olmo", "phi3-longrope",
                                        "smollm3-nope"])
def test_imported_file_round_trips_through_the_printer(model_type: str) -> None:
    """The per-layer expressions and the norm and rotary options print and parse back unchanged."""
    from blockir.ir.printer import format_program

    program = blockir.parse(block_text(CONFIGS[model_type], exact=True), f"<{model_type}>")
    printed = format_program(program)
    assert blockir.parse(printed, "printed.block") == program
