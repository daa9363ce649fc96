"""Direct logit attribution against a hand computation with the families' own module names,
and the decomposition's exactness: heads plus the rest add up to the logit difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.causal.test_patching import _random_task
from tests.models.tiny import build

from headlab.causal.dla import direct_logit_attribution
from headlab.models.loading import LoadedModel, load


# gemma3: post-norm blocks, each head's write through the norm on the attention's output
@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2", "gemma3"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = build(
        request.param, tmp_path_factory.mktemp(request.param), lm_head=True,
        attn_implementation="eager", seed=4, random_gains=request.param == "gemma3",
    )  # fmt: skip
    lm = load(folder, with_lm_head=True)
    lm.model.double()
    return lm


def _parts(model: torch.nn.Module):  # type: ignore[no-untyped-def]
    """(output projections, final norm, the norm's formula, a projection's columns, each
    layer's norm on the attention's output or ``None``) by the family's own names."""
    if hasattr(model, "transformer"):  # GPT-2: Conv1D c_proj (in, out), LayerNorm ln_f
        projs = [b.attn.c_proj for b in model.transformer.h]
        norm = model.transformer.ln_f

        def frozen(v, x):  # type: ignore[no-untyped-def]
            scale = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
            return (v - v.mean(-1, keepdim=True)) / scale * norm.weight

        return projs, norm, frozen, lambda w, cols: w[cols, :].t(), [None] * len(projs)
    projs = [layer.self_attn.o_proj for layer in model.model.layers]
    norm = model.model.norm
    if hasattr(model.model.layers[0], "pre_feedforward_layernorm"):  # Gemma: x / rms * (1 + g)

        def gemma(n):  # type: ignore[no-untyped-def]
            def frozen(v, x):  # type: ignore[no-untyped-def]
                return v / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + n.eps) * (1 + n.weight)

            return frozen

        post = [gemma(layer.post_attention_layernorm) for layer in model.model.layers]
        return projs, norm, gemma(norm), lambda w, cols: w[:, cols], post

    def frozen(v, x):  # type: ignore[no-untyped-def]
        scale = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
        return v / scale * norm.weight

    return projs, norm, frozen, lambda w, cols: w[:, cols], [None] * len(projs)


def test_dla_equals_a_hand_computation_and_adds_up(tiny: LoadedModel) -> None:
    task, raw = _random_task(tiny, 3, 7, seed=2)
    got = direct_logit_attribution(tiny, task)
    projs, norm, frozen, columns, post = _parts(tiny.model)
    gemma = tiny.model.config.model_type == "gemma3_text"
    n_heads = tiny.layout.heads_per_layer[0]
    w_u = tiny.model.get_output_embeddings().weight
    expected = torch.zeros(len(projs), n_heads, dtype=torch.float64)
    lds = []
    for clean, _, answer, distractor in raw:
        seen: dict[int, torch.Tensor] = {}
        hooks = [
            p.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0][0, -1]))  # noqa: B023
            for i, p in enumerate(projs)
        ]
        hooks.append(norm.register_forward_hook(lambda m, a, o: seen.__setitem__(-1, a[0][0, -1])))  # noqa: B023
        if gemma:  # the attention's output, which its post-norm normalises
            hooks += [
                b.post_attention_layernorm.register_forward_hook(
                    lambda m, a, o, i=i: seen.__setitem__(f"attn {i}", a[0][0, -1])  # noqa: B023
                )
                for i, b in enumerate(tiny.model.model.layers)
            ]
        with torch.no_grad():
            logits = tiny.model(input_ids=torch.tensor([clean])).logits[0, -1]
        for h in hooks:
            h.remove()
        lds.append(float(logits[answer] - logits[distractor]))
        direction = (w_u[answer] - w_u[distractor]).detach()
        with torch.no_grad():
            for layer, proj in enumerate(projs):
                d = seen[layer].shape[-1] // n_heads
                for head in range(n_heads):
                    cols = slice(head * d, (head + 1) * d)
                    c = columns(proj.weight, cols) @ seen[layer][cols]  # (E,)
                    if post[layer] is not None:
                        c = post[layer](c, seen[f"attn {layer}"])
                    expected[layer, head] += float(frozen(c, seen[-1]) @ direction)
    expected /= len(raw)
    torch.testing.assert_close(got.dla, expected, atol=1e-10, rtol=1e-9)
    # exact decomposition: every head's term plus the rest is the logit difference
    clean = sum(lds) / len(lds)
    assert got.clean == pytest.approx(clean, abs=1e-10)
    # (Gemma's norms compute in float32 inside, the decomposition in float64)
    tolerance = 1e-5 if gemma else 1e-9
    assert float(got.dla.sum()) + got.rest == pytest.approx(clean, abs=tolerance)
    kinds = {"gpt2": "layernorm", "gemma3_text": "rmsnorm (1 + g)"}
    assert got.norm == kinds.get(tiny.model.config.model_type, "rmsnorm")
    out = got.to_json()
    assert out["method"] == "dla" and len(out["heads"]) == tiny.n_layers * n_heads
    assert out["heads_total"] + out["rest"] == pytest.approx(clean, abs=tolerance)


def test_headlab_patch_method_dla(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.causal.test_patch_cli import PROMPTS, _jsonl

    from headlab.cli import main

    folder = build("llama", tmp_path / "m", lm_head=True, seed=5)
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(prompts)]
    assert main([*argv, "--method", "dla", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "dla" and {"layer", "head", "dla"} <= set(out["heads"][0])
    assert out["heads_total"] + out["rest"] == pytest.approx(out["metric"]["clean"], abs=1e-4)
    assert main([*argv, "--method", "dla"]) == 0
    text = capsys.readouterr().out
    assert "direct logit attribution" in text and "negative" in text
