"""The guide to a new role, tested: a probe and one :class:`~headlab.roles.registry.Role`
registered in-process, no other edit, are measured by ``headlab roles`` (on the treebank pass
and on the induction pass), drawn in the report's legend and served by the explorer's API;
unregistered, the role is gone again."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.cli import main
from headlab.errors import InputError
from headlab.roles import registry
from headlab.roles.bootstrap import Sums
from headlab.roles.classify import LETTERS, ROLES, Thresholds
from headlab.roles.geometry import Geometry

#: the toy role's bar: below the weight of a random tiny model's heads on the previous token
#: (their attention is about uniform over some 24 tokens: about 0.04)
BAR = 0.02


def previous_mass(weights: torch.Tensor, geo: Geometry, start: int) -> dict[str, torch.Tensor]:
    """The toy probe, on the treebank pass: each block's weight on the previous token summed
    over its real query rows, ``(B, H)`` from weights ``(B, H, t, S)`` of rows ``start..``."""
    rows = torch.arange(start, start + weights.shape[2], device=weights.device)
    has = rows >= 1  # the first token has no previous one
    previous = weights[:, :, has.nonzero()[:, 0], rows[has] - 1]  # (B, H, t')
    query = geo.query[:, None, start : start + weights.shape[2]][..., has]  # (B, 1, t')
    return {"toy.previous": (previous * query).sum(-1)}


def previous_weight(sums: Sums) -> dict[str, torch.Tensor]:
    """The toy role's score: the mean weight on the previous token over real tokens."""
    return {"toy-previous": sums.get("toy.previous") / sums.get("queries")[:, None, None]}


TOY = registry.Role(
    name="toy-previous",
    letter="Y",
    fed_by="treebank",
    bar=BAR,
    scorer=previous_weight,
    collect=previous_mass,
    shows=("toy-previous",),
    detail=lambda value: f"toy {value('toy-previous') or 0.0:.2f}",
)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_a_registered_role_is_measured_drawn_and_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.explore.shelf import Shelf
    from headlab.serve import Explorer, RoleSources

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    folder = build("bert", tmp_path / "bert")
    flags = ["--model", str(folder), "--limit", "12", "--replicates", "0", "--no-gap"]
    with registry.registered(TOY):
        assert "toy-previous" in ROLES and LETTERS["toy-previous"] == "Y"
        assert Thresholds().bar("toy-previous") == BAR
        roles = json.loads(_run(["-q", "roles", *flags, "--json"], capsys))
        # in the result: counted, scored for every head, its bar, its heads named with detail
        assert "toy-previous" in roles["role_counts"]
        assert roles["thresholds"]["toy_previous"] == BAR
        scores = [h["scores"]["toy-previous"] for h in roles["heads"]]
        assert len(scores) == 8 and all(isinstance(s, float) for s in scores)
        # the positional probe measures the same weight its own way
        assert scores == pytest.approx([h["scores"]["previous"] for h in roles["heads"]], abs=2e-4)
        assert all("toy-previous" in h["roles"] for h in roles["heads"])  # all clear its bar
        # the report's legend: its style in the page's data, a spare colour of its own
        out = tmp_path / "report"
        _run(["-q", "report", *flags, "--roles-only", "--out", str(out)], capsys)
        page = (out / "index.html").read_text(encoding="utf-8")
        data = re.search(r'<script type="application/json" id="headlab-data">(.*?)</script>', page)
        assert data is not None
        style = json.loads(data.group(1))["role_style"]
        assert style["toy-previous"]["letter"] == "Y"
        others = {s["colour"] for r, s in style.items() if r != "toy-previous"}
        assert style["toy-previous"]["colour"] not in others
        # the explorer's API: the roles run of the model, the role in its names and styles
        path = tmp_path / "roles.json"
        path.write_text(json.dumps(roles), encoding="utf-8")
        app = Explorer(Shelf(str(folder)), RoleSources([path]))
        response = app.handle("GET", "/api/roles")
        served = json.loads(response.body)
        assert response.status == 200, served
        assert "toy-previous" in served["roles"]
        assert served["role_style"]["toy-previous"] == style["toy-previous"]
    # undone: the registry is headlab's own again
    assert "toy-previous" not in ROLES and registry.get("toy-previous") is None
    assert "toy_previous" not in Thresholds().to_json()


def test_registration_refuses_clashes_and_keeps_builtin_roles() -> None:
    with pytest.raises(InputError, match="registered already"):
        registry.register(registry.role("induction"))
    with pytest.raises(InputError, match="letter 'I' is taken"):
        registry.register(registry.Role(name="idle", letter="I"))
    with pytest.raises(InputError, match="stays registered"):
        registry.unregister("sink")
    with pytest.raises(InputError, match="needs a scorer"):
        registry.Role(name="half", letter="H", bar=0.5)
    with pytest.raises(InputError, match="fed_by"):
        registry.Role(name="lost", letter="L", fed_by="nowhere")


def test_one_name_per_concept_its_bar_and_circuit_class_derived() -> None:
    """The role, its threshold and its circuit class are one name, spelled three ways by rule;
    the class's bar is the role's except where the registry says why not."""
    from headlab.experiments import head_classes

    previous = registry.role("previous-token")
    assert previous.threshold == "previous_token" and previous.circuit_class == "previous token"
    assert Thresholds().previous_token == previous.bar == 0.5
    assert head_classes.PREVIOUS == previous.class_bar == 0.4
    for role, _ in head_classes.ROLE_CLASSES:
        assert role.circuit_class in head_classes.CLASSES
        assert role.circuit_class in head_classes.CLASS_RULES
        assert vars(Thresholds())[role.threshold] == role.bar
    for role in registry.roles():
        if role.bar is not None:
            assert Thresholds().bar(role.name) == role.bar


def first_token_weight(pattern: torch.Tensor, half: int, start: int) -> dict[str, torch.Tensor]:
    """A toy probe of the induction pass: the mean weight on the sequence's first token from
    each token of the second copy, ``(B, H)`` from the pattern ``(B, H, T, T)``."""
    return {"toy_first": pattern[:, :, start + half :, 0].mean(-1)}


def first_token_score(sums: Sums) -> dict[str, torch.Tensor]:
    n = sums.get("induction.n")[:, None, None]
    return {"toy-first": sums.get("toy_first.sum") / n}


def test_a_role_with_its_own_probe_on_the_induction_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decoder role with a statistic of its own: the induction pass runs its probe beside
    the induction probe, and the report's decoder section lists it."""
    from headlab.report.decoder import decoder_roles

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    folder = build("llama", tmp_path / "llama")
    toy = registry.Role(
        name="toy-first",
        letter="F",
        fed_by="induction",
        bar=0.0,
        scorer=first_token_score,
        collect=first_token_weight,
        needs="induction.n",
        shows=("toy-first",),
        causal=True,
    )
    flags = ["--model", str(folder), "--limit", "8", "--replicates", "0", "--no-gap"]
    with registry.registered(toy):
        roles = json.loads(_run(["-q", "roles", *flags, "--json"], capsys))
        [listed] = [r for r in decoder_roles(roles) if r["role"] == "toy-first"]
    scores = [h["scores"]["toy-first"] for h in roles["heads"]]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)
    assert all(isinstance(h["scores"]["induction"], float) for h in roles["heads"])
    assert listed["bar"] == 0.0 and listed["clearing"] == len(roles["heads"])
    assert "toy-first" not in ROLES
