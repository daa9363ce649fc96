"""What ``headlab train`` prints of a run."""

from __future__ import annotations

from headlab.training.language_model import trained_text


def test_trained_text_names_the_folder_and_the_held_out_perplexity() -> None:
    info = {"held_out_perplexity": 12.3456, "held_out_tokens": 12345}
    assert trained_text("runs/lm/", info) == [
        "trained runs/lm: held-out perplexity 12.35 (12,345 tokens); load it with headlab.models.load"
    ]
