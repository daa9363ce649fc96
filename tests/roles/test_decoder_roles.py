"""Decoder roles on a tiny random GQA Llama: the previous-token, duplicate-token and induction
scores against a NumPy loop over Hugging Face's eager attentions, and the copying score against
a brute-force eigenvalue computation over the whole vocabulary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tests.models.tiny import FAMILIES, build, tokenizer_path

from headlab.datasets import read_conllu, sample_path
from headlab.models import load
from headlab.roles import RoleOptions, measure_roles
from headlab.roles.copying import copying_scores
from headlab.roles.probes import induction


def eager_scores(attentions: list[np.ndarray], half: int, start: int) -> dict[str, np.ndarray]:
    """``(L, H)`` mean weights, one query at a time, from eager patterns ``(B, H, T, T)``."""
    n_layers = len(attentions)
    n_batch, n_heads = attentions[0].shape[:2]
    second = start + half
    out = {k: np.zeros((n_layers, n_heads)) for k in induction.SCORES}
    for layer, att in enumerate(attentions):
        for h in range(n_heads):
            per_seq = {k: [] for k in induction.SCORES}
            for b in range(n_batch):
                a = att[b, h]
                ind = [a[t, t - half + 1] for t in range(second, second + half - 1)]
                prev = [a[t, t - 1] for t in range(start + 1, second)]
                dup = [a[t, t - half] for t in range(second, second + half)]
                per_seq["induction"].append(np.mean(ind))
                per_seq["previous-token"].append(np.mean(prev))
                per_seq["duplicate-token"].append(np.mean(dup))
            for k, values in per_seq.items():
                out[k][layer, h] = np.mean(values)
    return out


def test_decoder_scores_equal_a_loop_over_eager_attentions(tmp_path: Path) -> None:
    from transformers import AutoModel

    path = build("llama", tmp_path / "llama")
    lm = load(path)
    opts = RoleOptions(replicates=0, induction_sequences=5, induction_length=9, seed=4)
    report = measure_roles(lm, read_conllu(sample_path("treebank"), limit=4), options=opts)
    ids, start = induction.sequences(lm.tokenizer, 5, 9, opts.seed)
    eager = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        out = eager(input_ids=ids, output_attentions=True)
    want = eager_scores([a.double().numpy() for a in out.attentions], 9, start)
    for key, table in want.items():
        for head in report.heads:
            got = head.scores[key]
            assert got == pytest.approx(table[head.layer, head.head], abs=1e-5), key
            bar = vars(report.thresholds)[key.replace("-", "_")]
            assert (key in head.roles) == (got >= bar)
    # a base model with untied embeddings saved without its LM head has no unembedding:
    # its copying score is null, not an error
    assert all("copying" in h.scores and h.scores["copying"] is None for h in report.heads)


def _llama_with_head(folder: Path, *, tied: bool) -> Path:
    """A tiny random Llama with its LM head, a 97-token vocabulary and random norm gains."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    spec = {k: v for k, v in FAMILIES["llama"].items() if k != "model_type"}
    config = AutoConfig.for_model("llama", vocab_size=97, tie_word_embeddings=tied, **spec)
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # the gains must be folded in, not ones
                p.uniform_(0.3, 2.0)
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        folder
    )
    return folder


def brute_force_copying(folder: Path) -> np.ndarray:
    """``(L, H)``: Olsson et al.'s score from the full ``V x V`` OV circuit, float64."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float64)
    cfg = model.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // n_heads
    w_e = model.model.embed_tokens.weight.detach().numpy()  # (V, E)
    w_u = model.lm_head.weight.detach().numpy()  # (V, E)
    n_f = model.model.norm.weight.detach().numpy()
    out = np.zeros((cfg.num_hidden_layers, n_heads))
    for layer, block in enumerate(model.model.layers):
        n_in = block.input_layernorm.weight.detach().numpy()
        w_v = block.self_attn.v_proj.weight.detach().numpy()  # (Hkv*D, E)
        w_o = block.self_attn.o_proj.weight.detach().numpy()  # (E, H*D)
        for h in range(n_heads):
            g = h // (n_heads // n_kv)
            v = w_v[g * d : (g + 1) * d] * n_in  # (D, E)
            o = w_o[:, h * d : (h + 1) * d]  # (E, D)
            full = (w_u * n_f) @ o @ v @ w_e.T  # (V, V): source token -> logits
            eig = np.linalg.eigvals(full)
            out[layer, h] = eig.real.sum() / np.abs(eig).sum()
    return out


@pytest.mark.parametrize("tied", [True, False])
def test_copying_score_equals_the_full_vocabulary_eigenvalues(tmp_path: Path, tied: bool) -> None:
    """Untied: the base model has no head, so its weight is read from the folder."""
    folder = _llama_with_head(tmp_path / "llama", tied=tied)
    want = brute_force_copying(folder)
    got = copying_scores(load(folder)).numpy()
    assert np.abs(got - want).max() < 1e-6
    assert np.ptp(got) > 0.1  # random heads differ: the check is not of a constant
    # loaded with its LM head, the same scores
    assert np.abs(copying_scores(load(folder, with_lm_head=True)).numpy() - want).max() < 1e-6
