"""What ``headlab patch`` and ``headlab compose`` show a person (:mod:`headlab.causal.text`):
the right columns, the heads in the right order, the numbers as the results hold them."""

from __future__ import annotations

import torch

from headlab.causal.composition import CompositionScores
from headlab.causal.dla import DLAResult
from headlab.causal.paths import PathResult
from headlab.causal.request import ComposeResult
from headlab.causal.result import LayerTable, PatchingResult
from headlab.causal.text import compose_text, patch_text
from headlab.text import TextTable

EFFECTS = torch.tensor([[0.5, -0.9, 0.1], [0.05, 0.3, float("nan")]], dtype=torch.float64)


def _tables(parts: list) -> list[TextTable]:  # type: ignore[type-arg]
    return [p for p in parts if isinstance(p, TextTable)]


def _lines(parts: list) -> list[str]:  # type: ignore[type-arg]
    return [p for p in parts if isinstance(p, str)]


def test_patching_the_top_heads_by_size_beside_activation_and_the_layers() -> None:
    reference = PatchingResult(
        model="m", task="ioi", method="activation", position=None, n_prompts=4, clean=2.0,
        corrupt=-1.0, effects=EFFECTS * 2,
    )  # fmt: skip
    layers = LayerTable(
        resid=torch.tensor([1.0, 0.2, 0.0], dtype=torch.float64),
        attn=torch.tensor([0.1, -0.7, 0.0], dtype=torch.float64),
        mlp=torch.tensor([0.0, 0.1, float("nan")], dtype=torch.float64),
    )
    result = PatchingResult(
        model="m", task="ioi", method="attribution", position=-1, n_prompts=4, clean=2.0,
        corrupt=-1.0, effects=EFFECTS, reference=reference, layers=layers,
        correlation={"pearson": 0.95, "spearman": 0.9}, seconds=1.25,
    )  # fmt: skip
    parts = patch_text(result, top=2)
    lines = _lines(parts)
    assert lines[0] == (
        "attribution patching of m on ioi (4 prompts, position last): logit difference 2.000 "
        "clean, -1.000 corrupt, in 1.2 s"
    )
    assert lines[1] == "against activation patching: Pearson 0.950, Spearman 0.900"
    assert lines[2] == "activation patching's top: 0.1 -1.80, 0.0 +1.00"
    heads, per_layer = _tables(parts)
    assert heads.columns == ("layer.head", "attribution", "activation")
    assert heads.rows == (("0.1", "-0.900", "-1.800"), ("0.0", "+0.500", "+1.000"))
    assert heads.title == "top 2 heads by |effect| (share of the logit difference removed)"
    assert per_layer.columns == ("layer", "residual in", "attention out", "MLP out")
    assert per_layer.rows == (
        ("0", "+1.000", "+0.100", "+0.000"),
        ("1", "+0.200", "-0.700", "+0.100"),
        ("2", "+0.000", "+0.000", "-"),  # a layer without a recognisable MLP
    )


def test_the_layer_table_ranks_what_a_layer_adds_not_the_residuals_ties() -> None:
    """With every position patched the residual stream carries the whole corrupted input: its
    column is 1.000 at every layer. The 5 layers shown are those whose attention or MLP
    matters most (here 7, 3, 5, 2, 6), in layer order; not layers 0-4 by the tie."""
    n = 8
    attn = torch.tensor([0.0, 0.01, 0.2, 0.4, 0.0, 0.0, 0.1, 0.77], dtype=torch.float64)
    mlp = torch.tensor([0.02, 0.0, 0.0, 0.0, 0.03, 0.3, 0.0, 0.0], dtype=torch.float64)
    result = PatchingResult(
        model="m", task="induction", method="activation", position=None, n_prompts=4,
        clean=2.0, corrupt=-1.0, effects=EFFECTS,
        layers=LayerTable(resid=torch.ones(n, dtype=torch.float64), attn=attn, mlp=mlp),
    )  # fmt: skip
    per_layer = _tables(patch_text(result))[-1]
    assert [row[0] for row in per_layer.rows] == ["2", "3", "5", "6", "7"]


def test_kv_heads_are_headed_as_kv_heads() -> None:
    result = PatchingResult(
        model="m", task="ioi", method="activation", position=None, n_prompts=4, clean=2.0,
        corrupt=-1.0, effects=EFFECTS, component="k",
    )  # fmt: skip
    heads = _tables(patch_text(result))[0]
    assert heads.columns[0] == "layer.KV head"
    assert heads.title.startswith("top 10 KV heads")


def test_dla_splits_the_logit_difference_and_marks_negative_heads() -> None:
    result = DLAResult(
        model="m", task="ioi", n_prompts=2, clean=1.5, dla=EFFECTS, rest=0.45, norm="rmsnorm"
    )
    parts = patch_text(result, top=3)
    assert _lines(parts) == [
        "direct logit attribution of m on ioi (2 prompts, final norm rmsnorm frozen at the "
        "clean run): logit difference 1.500 = heads 0.050 + the rest 0.450"
    ]
    (heads,) = _tables(parts)
    assert heads.columns == ("layer.head", "dla", "")
    assert heads.rows == (
        ("0.1", "-0.900", "negative"),
        ("0.0", "+0.500", ""),
        ("1.1", "+0.300", ""),
    )


def test_path_patching_lists_the_senders_by_size() -> None:
    result = PathResult(
        model="m", task="ioi", receiver="q:1.0", n_prompts=2, clean=1.0, corrupt=0.0,
        effects=EFFECTS, seconds=3.0,
    )  # fmt: skip
    parts = patch_text(result, top=1)
    assert _lines(parts)[0].startswith("path patching of m on ioi to q:1.0 (2 prompts)")
    (senders,) = _tables(parts)
    assert senders.columns == ("sender", "effect") and senders.rows == (("0.1", "-0.900"),)
    assert senders.title == "top 1 senders by |effect| of their path to q:1.0"


def _scores() -> CompositionScores:
    nan = float("nan")
    q = torch.full((2, 2, 2, 2), nan, dtype=torch.float64)
    q[0, :, 1, :] = torch.tensor([[0.2, 0.4], [0.6, 0.1]], dtype=torch.float64)
    return CompositionScores(
        model="m", q=q, k=q * 0.5, v=q.flip(1), baseline={"q": 0.2, "k": 0.1, "v": 0.4}
    )


def test_compose_lists_each_kinds_top_pairs_over_their_baseline() -> None:
    tables = _tables(compose_text(ComposeResult(scores=_scores(), kind="k"), top=2))
    assert [t.title for t in tables] == [
        "Q-composition of m: top 2 (baseline 0.200)",
        "K-composition of m: top 2 (baseline 0.100)",
        "V-composition of m: top 2 (baseline 0.400)",
    ]
    assert tables[0].columns == ("sender", "receiver", "score", "x baseline")
    assert tables[0].rows == (("0.1", "1.0", "0.600", "3.00"), ("0.0", "1.1", "0.400", "2.00"))


def test_compose_receivers_each_with_its_strongest_senders() -> None:
    senders = [
        {
            "receiver": {"layer": 1, "head": 0},
            "senders": [{"layer": 0, "head": 1, "score": 0.3, "x_baseline": 3.0},
                        {"layer": 0, "head": 0, "score": 0.1, "x_baseline": 1.0}],
        }
    ]  # fmt: skip
    result = ComposeResult(scores=_scores(), kind="k", senders=senders)
    assert result.to_json()["baseline"] == 0.1
    (shown,) = _tables(compose_text(result, top=2))
    assert shown.title == "K-composition of m: what each head reads (baseline 0.100)"
    assert shown.columns == ("receiver", "top 2 senders (x baseline)")
    assert shown.rows == (("1.0", "0.1 3.0, 0.0 1.0"),)
