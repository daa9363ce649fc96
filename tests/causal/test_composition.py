"""Composition scores (Elhage et al. 2021) against the definition computed directly with
E x E matrices, read from each family's own modules, in float64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.causal.composition import composition_scores
from headlab.models.loading import LoadedModel, load


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = build(request.param, tmp_path_factory.mktemp(request.param), lm_head=True, seed=6)
    lm = load(folder, with_lm_head=True)
    with torch.no_grad():  # gains away from 1, so that folding them in is tested
        for name, p in lm.model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and "weight" in name:
                p.uniform_(0.5, 1.5)
    return lm


def _matrices(lm: LoadedModel) -> list[dict[str, list[torch.Tensor]]]:
    """Each layer's per-head W_QK and W_OV (E x E), from the family's own module names."""
    model = lm.model.double()
    n_heads, n_kv, d = (lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0], lm.head_dim)
    group = n_heads // n_kv
    out = []
    if hasattr(model, "transformer"):  # GPT-2: Conv1D (in, out) weights, ln_1 before them
        width = model.config.n_embd
        for block in model.transformer.h:
            gain = block.ln_1.weight
            w = block.attn.c_attn.weight  # (E, 3E)

            def rows(start: int, h: int, w=w, gain=gain) -> torch.Tensor:  # type: ignore[no-untyped-def]
                return w[:, start + h * d : start + (h + 1) * d].T * gain

            o = block.attn.c_proj.weight  # (E_in = H*D, E)
            out.append(
                {
                    "qk": [rows(0, h).T @ rows(width, h) for h in range(n_heads)],
                    "ov": [o[h * d : (h + 1) * d].T @ rows(2 * width, h) for h in range(n_heads)],
                }
            )
        return out
    for layer in model.model.layers:
        gain = layer.input_layernorm.weight
        attn = layer.self_attn
        q, k, v = (m.weight * gain for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        o = attn.o_proj.weight  # (E, H*D)
        out.append(
            {
                "qk": [
                    q[h * d : (h + 1) * d].T @ k[(h // group) * d : (h // group + 1) * d]
                    for h in range(n_heads)
                ],
                "ov": [
                    o[:, h * d : (h + 1) * d] @ v[(h // group) * d : (h // group + 1) * d]
                    for h in range(n_heads)
                ],
            }
        )
    return out


def _score(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))


def test_scores_equal_the_definition_with_full_matrices(tiny: LoadedModel) -> None:
    got = composition_scores(tiny)
    with torch.no_grad():
        mats = _matrices(tiny)
    n_heads = tiny.layout.heads_per_layer[0]
    for l1 in range(tiny.n_layers):
        for l2 in range(tiny.n_layers):
            for h1 in range(n_heads):
                for h2 in range(n_heads):
                    if l2 <= l1:
                        assert got.q[l1, h1, l2, h2].isnan()
                        continue
                    ov1 = mats[l1]["ov"][h1]
                    qk2, ov2 = mats[l2]["qk"][h2], mats[l2]["ov"][h2]
                    expected = {
                        "q": _score(qk2.T, ov1),
                        "k": _score(qk2, ov1),
                        "v": _score(ov2, ov1),
                    }
                    for kind, value in expected.items():
                        assert float(got.scores(kind)[l1, h1, l2, h2]) == pytest.approx(
                            value, rel=1e-9, abs=1e-12
                        ), (kind, l1, h1, l2, h2)
    for kind in ("q", "k", "v"):
        assert 0.0 < got.baseline[kind] < 1.0


def test_the_baseline_is_what_random_weights_score() -> None:
    """Gaussian heads of the same shapes score the baseline on average, and no real pair's
    score means anything unless it stands above it."""
    from headlab.causal.composition import _baseline

    base = _baseline(8, 32, torch.float64)
    g = torch.Generator().manual_seed(123)
    samples = []
    for _ in range(64):
        wq, wk = (torch.randn(8, 32, generator=g, dtype=torch.float64) for _ in range(2))
        wv1 = torch.randn(8, 32, generator=g, dtype=torch.float64)
        wo1 = torch.randn(32, 8, generator=g, dtype=torch.float64)
        samples.append(_score(wq.T @ wk, wo1 @ wv1))
    assert sum(samples) / len(samples) == pytest.approx(base["k"], rel=0.1)


def test_headlab_compose_lists_pairs_best_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.cli import main

    folder = build("llama", tmp_path / "m", lm_head=True, seed=6)
    assert main(["-q", "compose", "--model", str(folder), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pairs = out["pairs"]
    n_heads = 4
    assert len(pairs) == n_heads * n_heads  # two layers: every (layer 0, layer 1) pair
    best = [max(p["q"] / out["baseline"]["q"], p["k"] / out["baseline"]["k"],
                p["v"] / out["baseline"]["v"]) for p in pairs]  # fmt: skip
    assert best == sorted(best, reverse=True)
    assert {"sender", "receiver", "q", "k", "v"} <= set(pairs[0])
    assert pairs[0]["sender"]["layer"] == 0 and pairs[0]["receiver"]["layer"] == 1
    assert main(["-q", "compose", "--model", str(folder), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "K-composition" in text and "baseline" in text


def test_compose_receivers_lists_and_draws_what_each_head_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.cli import main

    folder = build("llama", tmp_path / "m", lm_head=True, seed=6)
    scores = composition_scores(load(folder, with_lm_head=True))
    figure = tmp_path / "k.png"
    argv = ["-q", "compose", "--model", str(folder), "--receivers", "1.2,1.0", "--top", "4"]
    assert main([*argv, "--figure", str(figure), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["receiver"] for r in out["receivers"]] == [
        {"layer": 1, "head": 2},
        {"layer": 1, "head": 0},
    ]
    for row in out["receivers"]:
        r = row["receiver"]
        expected = sorted(
            ((float(scores.k[0, h, r["layer"], r["head"]]), h) for h in range(4)), reverse=True
        )
        assert [s["head"] for s in row["senders"]] == [h for _, h in expected]
        assert [s["score"] for s in row["senders"]] == pytest.approx([v for v, _ in expected])
        assert [s["layer"] for s in row["senders"]] == [0] * 4
        assert row["senders"][0]["x_baseline"] == pytest.approx(
            expected[0][0] / scores.baseline["k"]
        )
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad, message in (
        (["--receivers", "1-2"], "expects heads as LAYER.HEAD"),
        (["--receivers", "0.1"], "--receivers 0.1: layer 0 is out of range"),
        (["--receivers", "1.9"], "head 9 is out of range; layer 1 has heads 0..3"),
        (["--figure", str(tmp_path / "x.png")], "--figure draws the heads of --receivers"),
    ):
        assert main(["compose", "--model", str(folder), *bad]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
