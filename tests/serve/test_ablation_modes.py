"""Mean ablation beside zero ablation (#46, item 9): a switched-off head says its average over
reference text instead of nothing, in the library, the API and the page."""

from __future__ import annotations

import pytest
import torch

from headlab.errors import InputError
from headlab.explore.ablation import (
    ablation_effect,
    next_tokens,
    reference_means,
    resample_source,
    token_count,
)
from headlab.models import load

TEXT = "To be or not to be, that is the"


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-shakespeare", with_lm_head=True)


def test_mean_ablation_puts_the_heads_average_in_its_place(tiny) -> None:
    means = reference_means(tiny, n=20)
    assert set(means) == set(range(tiny.n_layers)) and means[1].shape == (4, tiny.head_dim)
    got = next_tokens(tiny, TEXT, ablate={1: [2]}, means=means, k=3)
    # the oracle: a hook on layer 1's output projection writes head 2's mean into its slice
    d = tiny.head_dim
    module = tiny.layers[1].out_proj

    def hook(_module, args):
        x = args[0].clone()
        x[..., 2 * d : 3 * d] = means[1][2].to(x)
        return (x, *args[1:])

    handle = module.register_forward_pre_hook(hook)
    try:
        ids = tiny.tokenizer(TEXT, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            probs = torch.softmax(tiny.model(input_ids=ids).logits[0, -1].float(), -1)
    finally:
        handle.remove()
    values, indices = probs.topk(3)
    expected = [
        (tiny.tokenizer.decode([int(i)]), float(v)) for i, v in zip(indices, values, strict=True)
    ]
    assert [t for t, _ in got] == [t for t, _ in expected]
    assert [p for _, p in got] == pytest.approx([p for _, p in expected], abs=1e-5)
    zero = ablation_effect(tiny, TEXT, {1: [2]}, k=3)
    mean = ablation_effect(tiny, TEXT, {1: [2]}, k=3, means=means)
    assert zero.before == mean.before and zero.after != mean.after


def test_the_api_switches_heads_off_as_zeros_or_means(client) -> None:
    body = {"text": TEXT, "model": "tiny-shakespeare", "ablate": [[0, 0], [1, 2], [3, 1]]}
    _, zero = client.call("/api/ablate", body)
    status, mean = client.call("/api/ablate", {**body, "mode": "mean"})
    assert status == 200 and (zero["mode"], mean["mode"]) == ("zero", "mean")
    assert zero["before"] == mean["before"] and zero["after"] != mean["after"]
    status, bad = client.call("/api/ablate", {**body, "mode": "resampled"})
    assert status == 400 and "'mode' must be zero, mean or resample" in bad["error"]


def test_resample_ablation_puts_another_sentences_outputs_in_place(tiny) -> None:
    """Resample ablation: a switched-off head says what it said on a reference sentence, at
    each position; the oracle records that sentence's input to the output projection by hook
    and writes the head's slice of it into the text's run."""
    n_tokens = token_count(tiny, TEXT)
    source = resample_source(tiny, n_tokens, seed=3)
    ids_ref = tiny.tokenizer(source.text, return_tensors="pt")["input_ids"]
    assert ids_ref.shape[-1] >= n_tokens and source.outputs[1].shape[1:] == (4, tiny.head_dim)
    d = tiny.head_dim
    module = tiny.layers[1].out_proj
    seen = {}

    def record(_module, args):
        seen["x"] = args[0].detach().clone()

    handle = module.register_forward_pre_hook(record)
    with torch.inference_mode():
        tiny.model(input_ids=ids_ref)
    handle.remove()

    def write(_module, args):
        x = args[0].clone()
        t = x.shape[1]
        x[..., 2 * d : 3 * d] = seen["x"][:, :t, 2 * d : 3 * d]
        return (x, *args[1:])

    handle = module.register_forward_pre_hook(write)
    try:
        ids = tiny.tokenizer(TEXT, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            probs = torch.softmax(tiny.model(input_ids=ids).logits[0, -1].float(), -1)
    finally:
        handle.remove()
    values, indices = probs.topk(3)
    got = ablation_effect(tiny, TEXT, {1: [2]}, k=3, resample=source)
    assert [t["token"] for t in got.to_json()["after"]] == [
        tiny.tokenizer.decode([int(i)]) for i in indices
    ]
    assert [p for _, p in got.after] == pytest.approx(values.tolist(), abs=1e-5)
    assert got.resampled_from == source.text
    zero = ablation_effect(tiny, TEXT, {1: [2]}, k=3)
    assert zero.after != got.after and zero.before == got.before
    # the same seed draws the same sentence; a text longer than every reference is refused
    assert resample_source(tiny, n_tokens, seed=3).text == source.text
    with pytest.raises(InputError, match="at least 100000 tokens"):
        resample_source(tiny, 100_000)


def test_the_api_resamples_from_a_named_sentence(client) -> None:
    body = {"text": "The chef prepared the fish.", "model": "minilm", "ablate": [[0, 1], [2, 4]]}
    _, zero = client.call("/api/ablate", body)
    status, first = client.call("/api/ablate", {**body, "mode": "resample", "other": "A meal."})
    assert status == 200 and first["mode"] == "resample" and first["resampled_from"]
    assert first["self_similarity"] != zero["self_similarity"]
    seeds = {
        client.call("/api/ablate", {**body, "mode": "resample", "seed": s})[1]["resampled_from"]
        for s in range(4)
    }
    assert len(seeds) > 1  # the seed draws the reference sentence
    status, bad = client.call("/api/ablate", {**body, "mode": "resample", "seed": -1})
    assert status == 400 and "'seed' must be an integer" in bad["error"]
