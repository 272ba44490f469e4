"""The rest of the compiler on imported models: the fused backend, the inference folds and the cost ledger."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_import_hf import CONFIGS, _class_name  # noqa: E402

import blockir  # noqa: E402
from blockir.cli import main  # noqa: E402
from blockir.api import hf_block_text as block_text  # noqa: E402
from blockir.lower.fold import apply_folds  # noqa: E402

FAMILIES = ["llama", "gpt_neox", "gemma3_text"]


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    keep = torch.ones(2, 7, dtype=torch.long)
    keep[1, -2:] = 0
    return ids, keep


def _run(model: torch.nn.Module, ids: torch.Tensor, keep: torch.Tensor):
    model.zero_grad()
    y = model(ids, attention_mask=keep)
    (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_fused_backend_equals_fx_on_an_imported_model(model_type: str) -> None:
    program = blockir.parse(block_text(CONFIGS[model_type]))
    name = _class_name(model_type)
    fx = blockir.compile(program, name, seed=1).eval()
    fused = blockir.compile(program, name, "fused", seed=1).eval()
    fused.load_state_dict(fx.state_dict(), strict=True)
    ids, keep = _inputs()
    (y0, g0), (y1, g1) = _run(fx, ids, keep), _run(fused, ids, keep)
    torch.testing.assert_close(y1, y0, rtol=1e-6, atol=1e-6)
    assert g1.keys() == g0.keys()
    floor = 1e-6 * max(g.abs().max().item() for g in g0.values())
    for k in g0:
        err = (g1[k] - g0[k]).abs().max().item()
        assert err <= 1e-5 * g0[k].abs().max().item() + floor, (k, err)


def _randomized(program, name: str) -> torch.nn.Module:
    module = blockir.compile(program, name, dtype=torch.float64, seed=0).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for value in module.state_dict().values():
            if value.is_floating_point():
                value.copy_(0.3 * torch.randn(value.shape, generator=g, dtype=value.dtype) + 0.5)
    return module


@pytest.mark.parametrize("model_type, folded", [("llama", ["model.norm"]), ("gpt_neox", []),
                                                ("gemma3_text", [])])
def test_folded_inference_equals_unfolded_in_float64(model_type: str, folded: list[str]) -> None:
    """The final norm's gain folds into an untied head; a tied head, or a shift with no head bias, is kept."""
    program = blockir.parse(block_text(CONFIGS[model_type]))
    name = _class_name(model_type)
    module = _randomized(program, name)
    result = apply_folds(program, name, module)
    assert [e.site.name for e in result.fired] == folded
    reasons = {e.site.name: e.code for e in result.refused}
    assert reasons == ({} if folded else {"gpt_neox": {"gpt_neox.final_layer_norm": "no_bias"},
                                          "gemma3_text": {"model.norm": "tied"}}[model_type])
    ids, keep = _inputs()
    with torch.no_grad():
        want, got = module(ids, attention_mask=keep), result.module.eval()(ids, attention_mask=keep)
    assert ((got - want).norm() / want.norm()).item() < 1e-12
    if folded:
        assert "model.norm.weight" not in result.module.state_dict()


@pytest.mark.parametrize("model_type, fired, kept", [
    ("llama", {"input_layernorm", "post_attention_layernorm"}, {}),
    # GPT-NeoX's query_key_value interleaves q, k and v per head: the attention's norm is kept
    ("gpt_neox", {"post_attention_layernorm"}, {"input_layernorm": "layout"}),
    ("bert", {"dropout(%0)", "dropout(%4)"}, {"attention.output.LayerNorm": "not_linear",
                                              "output.LayerNorm": "not_linear"}),
])
def test_the_decoder_layer_folds_its_norm_gains_into_the_projections(model_type: str, fired: set, kept: dict) -> None:
    """The projections are found under the names the declaration gives them (``dense_h_to_4h``)."""
    config = CONFIGS[model_type] if model_type in CONFIGS else dict(CONFIGS["llama"], model_type=model_type)
    # f64 statistics: with the default f32 ones the unfolded LayerNorm itself rounds at 1e-8
    program = blockir.parse(block_text(config).replace("eps=1e-05)", "eps=1e-05, accum=f64)"))
    layer = next(b.name for b in program.blocks if b.kind == "block")
    module = _randomized(program, layer)
    result = apply_folds(program, layer, module)
    assert {e.site.name for e in result.fired} == fired
    assert {e.site.name: e.code for e in result.refused if e.code != "nonlinearity"} == kept
    x = torch.randn(2, 7, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, got = module(x), result.module.eval()(x)
    assert ((got - want).norm() / want.norm()).item() < 1e-12


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text", "gpt2", "gptj"])
def test_cost_counts_the_parameters_and_matmul_flops_of_the_hf_model(model_type: str, tmp_path) -> None:
    """Parameters equal the HF model's (a tied head once); FLOPs: 2 × tokens per projection weight, plus the
    attention's two S × S products per layer, from the config."""
    torch.manual_seed(0)
    real = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CONFIGS[model_type]))
    path = tmp_path / "m.block"
    path.write_text(block_text(real.config.to_dict()), encoding="utf-8")
    batch, seq = 3, 11
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["cost", str(path), "--dims", f"B={batch},S={seq}", "--format", "json"]) == 0
    data = json.loads(out.getvalue())
    assert data["parameters"] == sum(p.numel() for p in real.parameters())
    embeddings = {id(m.weight) for m in real.modules() if isinstance(m, torch.nn.Embedding)}
    matrices = [p for m in real.modules() if not isinstance(m, torch.nn.Embedding)
                for p in m.parameters(recurse=False) if p.dim() == 2 and id(p) not in embeddings]
    head = real.get_output_embeddings().weight  # the head multiplies even when it is the embedding's matrix
    projections = sum(p.numel() for p in matrices if p is not head) + head.numel()
    cfg = real.config
    width = cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    want = 2 * batch * seq * projections + 4 * batch * seq * seq * width * cfg.num_hidden_layers
    assert data["matmul_flops_forward"] == want
