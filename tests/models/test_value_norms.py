"""Attention weighted by value norms (Kobayashi et al. 2020; #46, item 9): each weight times the
size of what the key token gives the head, ``||W_O^h v_s||``, beside the raw weights.

The oracle is Hugging Face's eager model with its own attention weights and a hook on the value
projection, and a NumPy loop over heads and positions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tests.models.tiny import build

from headlab.explore.sentence import capture_sentence
from headlab.models import load
from headlab.models.analysis import word_attention

TEXT = "the cat sat on the mat because it was warm"


def _oracle(folder: Path, family: str) -> list[np.ndarray]:
    """Per layer ``(H, T, T)``: a_ts * ||W_O^h v_s||, rows rescaled to 1, from HF eager."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation="eager").double().eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = model.config
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    d = config.hidden_size // n_heads
    blocks = model.encoder.layer if family == "bert" else model.layers
    values: dict[int, np.ndarray] = {}
    hooks = []
    for i, block in enumerate(blocks):
        v_module = block.attention.self.value if family == "bert" else block.self_attn.v_proj

        def keep(_m, _args, out, i=i):
            values[i] = out[0].detach().numpy()  # (T, Hkv*D)

        hooks.append(v_module.register_forward_hook(keep))
    ids = tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        out = model(**ids, output_attentions=True)
    for h in hooks:
        h.remove()
    expected = []
    for i, block in enumerate(blocks):
        o = block.attention.output.dense if family == "bert" else block.self_attn.o_proj
        w_o = o.weight.detach().numpy()  # (E, H*D)
        attn = out.attentions[i][0].numpy()  # (H, T, T)
        v = values[i]
        n_t = attn.shape[-1]
        weighted = np.zeros_like(attn)
        for h in range(n_heads):
            g = h // (n_heads // n_kv)
            for s in range(n_t):
                f = w_o[:, h * d : (h + 1) * d] @ v[s, g * d : (g + 1) * d]
                weighted[h, :, s] = attn[h, :, s] * np.sqrt((f**2).sum())
        expected.append(weighted / weighted.sum(-1, keepdims=True))
    return expected


@pytest.mark.parametrize("family", ["bert", "llama"])  # llama: 4 query heads on 2 KV heads
def test_norm_weighted_patterns_match_an_eager_loop(family: str, tmp_path: Path) -> None:
    folder = build(family, tmp_path / family)
    lm = load(folder, dtype=torch.float64)
    got = word_attention(lm, TEXT, tokens=True, norms=True)
    expected = _oracle(folder, family)
    for layer, want in enumerate(expected):
        have = got.norm_token_patterns[layer].double().numpy()
        np.testing.assert_allclose(have, want, atol=1e-6)
        # and the raw weights stay the raw weights
        assert not np.allclose(have, got.token_patterns[layer].double().numpy(), atol=1e-3)
        rows = got.norm_patterns[layer].sum(-1)
        torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)


def test_value_norms_shrink_minilms_special_tokens() -> None:
    """Kobayashi et al. (2020): much of BERT's attention to [CLS] and [SEP] carries little,
    their transformed value vectors being small; weighted by norms, their share falls."""
    lm = load()
    heads = capture_sentence(lm, "The chef who ran the kitchen prepared the fish carefully.")
    words = heads.words
    special = torch.tensor([w in ("[CLS]", "[SEP]") for w in words])
    raw, weighted = [], []
    for layer in range(lm.n_layers):
        for head in range(lm.layout.heads_per_layer[layer]):
            raw.append(float(heads.pattern(layer, head)[:, special].sum(-1).mean()))
            p = heads.pattern(layer, head, weighting="norm")
            weighted.append(float(p[:, special].sum(-1).mean()))
    raw_mean, weighted_mean = sum(raw) / len(raw), sum(weighted) / len(weighted)
    assert weighted_mean < 0.6 * raw_mean, (raw_mean, weighted_mean)
    data = heads.to_json()
    assert len(data["norm_patterns"]) == len(data["patterns"]) == lm.n_layers
    with pytest.raises(Exception, match="weighting must be one of attention, norm"):
        heads.pattern(0, 0, weighting="value")
