"""``headlab cards`` on SmolLM2-135M (the bundled decoder), once: the induction task's patching
and DLA on every head's card equal ``headlab patch``'s, and the verdict of the head that carries
the task most, patched at the last position, says it acts like an induction head."""

from __future__ import annotations

from pathlib import Path

import pytest

from headlab.causal.request import PatchRequest
from headlab.experiments.cards import CardsRequest
from headlab.models.loading import load

pytestmark = pytest.mark.slow


def test_smollm2_cards_are_headlab_patch(smollm2_folder: Path) -> None:
    lm = load(smollm2_folder, with_lm_head=True)
    model = str(smollm2_folder)
    options = {"tasks": ("induction",), "n": 8, "no_roles": True, "no_compose": True,
               "no_importance": True}  # fmt: skip
    data = CardsRequest(model=model, **options).run(lm).to_json()
    assert len(data["cards"]) == 270 and data["cards"][-1]["id"] == "29.8"
    asked = PatchRequest(model=model, task="induction", n=8, position="last", no_layers=True)
    effects = [h["effect"] for h in asked.run(lm).to_json()["heads"]]
    assert [c["does"]["patching"]["induction"] for c in data["cards"]] == effects
    dla = PatchRequest(model=model, task="induction", n=8, method="dla").run(lm).to_json()
    assert [c["writes"]["dla"]["induction"] for c in data["cards"]] == [
        h["dla"] for h in dla["heads"]
    ]
    top = max(data["cards"], key=lambda c: c["does"]["patching"]["induction"])
    assert top["verdict"].startswith("acts like an induction head")
    assert top["writes"]["unembedding"] == "language-model head"
    assert len(top["writes"]["promoted"]) == 5
