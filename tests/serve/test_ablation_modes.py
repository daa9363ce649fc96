"""Mean ablation beside zero ablation (#46, item 9): a switched-off head says its average over
reference text instead of nothing, in the library, the API and the page."""

from __future__ import annotations

import pytest
import torch

from headlab.explore.ablation import ablation_effect, next_tokens, reference_means
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
    status, bad = client.call("/api/ablate", {**body, "mode": "resample"})
    assert status == 400 and "'mode' must be zero or mean" in bad["error"]
