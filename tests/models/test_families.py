"""Every adapter on tiny random models: capture, patterns, ablation, against independent oracles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.models.tiny import FAMILIES, build
from torch import nn

from headlab.models import HeadCapture, LoadedModel, encode, load

TEXTS = [
    "The chef who trained in Paris prepared the fish.",
    "Short one.",
    "A third sentence, of middling length",
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    folder = build(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder


@pytest.fixture(scope="module")
def lm(family: tuple[str, Path]) -> LoadedModel:
    return load(family[1])


def _eager(folder: Path) -> torch.nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    ).eval()


def _sdpa(folder: Path) -> torch.nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), local_files_only=True).eval()


def _padding_side(lm: LoadedModel) -> None:
    lm.tokenizer.padding_side = "right"


def test_patterns_equal_eager_attentions(lm: LoadedModel, family: tuple[str, Path]) -> None:
    _padding_side(lm)
    batch = encode(lm, TEXTS)
    with torch.no_grad():
        eager = _eager(family[1])(**batch, output_attentions=True)
        with HeadCapture(lm) as cap:
            lm.model(**batch)
    real = batch["attention_mask"].bool()
    assert len(eager.attentions) == lm.n_layers
    for layer in range(lm.n_layers):
        ours = cap.pattern(layer)
        theirs = eager.attentions[layer]
        assert ours.shape == theirs.shape
        # compare every real query row (padded query rows are not used by anyone)
        diff = (ours - theirs).abs()[real[:, None, :, None].expand_as(ours)]
        assert diff.max() < 1e-5, f"{family[0]} layer {layer}: {diff.max()}"
        # selected heads are the same rows of the full pattern
        torch.testing.assert_close(cap.pattern(layer, heads=[1, 3]), ours[:, [1, 3]])


class _Blocks:
    """A block consumer that keeps everything it is handed."""

    def __init__(self, columns: torch.Tensor) -> None:
        self._columns = columns
        self.blocks: dict[int, list[tuple[int, ...]]] = {}
        self.done: list[int] = []

    def columns(self, layer: int) -> torch.Tensor:
        return self._columns

    def block(self, layer: int, start: int, *parts: torch.Tensor) -> None:
        self.blocks.setdefault(layer, []).append((start, *(p.clone() for p in parts)))

    def layer_done(self, layer: int) -> None:
        self.done.append(layer)


@pytest.mark.parametrize(
    ("block_elements", "n_columns"), [(64, 3), (1 << 20, 3), (64, 6), (64, 40)]
)
def test_streaming_attention_matches_eager_and_sdpa(
    lm: LoadedModel,
    family: tuple[str, Path],
    block_elements: int,
    n_columns: int,
    kernels: str,
) -> None:
    """headlab's block attention: the model's outputs as with sdpa, and every block's weights,
    entropy, largest weight and column sums as HF eager's attention maps give them (up to 4
    columns summed in the native kernel, a few more riding in the values' product, many with a
    product of their own), with the native row kernels and with torch's ops alone."""
    from headlab.models.streaming import StreamingAttention

    _padding_side(lm)
    batch = encode(lm, TEXTS)
    n_batch, n_tok = batch["input_ids"].shape
    columns = torch.rand(n_batch, n_tok, n_columns, generator=torch.Generator().manual_seed(0))
    consumer = _Blocks(columns)
    with torch.no_grad():
        eager = _eager(family[1])(**batch, output_attentions=True)
        plain = _sdpa(family[1])(**batch).last_hidden_state
        with StreamingAttention(lm, consumer, block_elements=block_elements):
            ours = lm.model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (ours - plain)[real].abs().max() < 1e-5
    assert consumer.done == list(range(lm.n_layers))
    for layer in range(lm.n_layers):
        maps = eager.attentions[layer]
        covered = 0
        for start, weights, entropy, top, mixed in consumer.blocks[layer]:
            t, seen = weights.shape[2], weights.shape[3]
            assert start == covered
            covered += t
            expect = maps[:, :, start : start + t]
            rows = real[:, None, start : start + t].expand(-1, maps.shape[1], -1)  # (B, H, t)
            if seen < n_tok:  # a causal block is handed only the keys it can see
                assert expect[..., seen:].abs().amax(-1)[rows].max() == 0
            assert (weights - expect[..., :seen]).abs().amax(-1)[rows].max() < 1e-5
            assert (entropy + torch.xlogy(expect, expect).sum(-1))[rows].abs().max() < 1e-4
            assert (top - expect.amax(-1))[rows].abs().max() < 1e-5
            assert (mixed - expect @ columns[:, None]).abs().amax(-1)[rows].max() < 1e-5
        assert covered == n_tok


def test_streaming_stop_after_last_sees_every_block_and_skips_the_rest(lm: LoadedModel) -> None:
    """``stop_after_last``: the consumer gets the same blocks as from a whole forward pass, the
    ``with`` block ends quietly at the forward call, and the last layer's MLP never runs."""
    from headlab.models.streaming import StreamingAttention

    _padding_side(lm)
    batch = encode(lm, TEXTS)
    columns = torch.rand(*batch["input_ids"].shape, 3, generator=torch.Generator().manual_seed(1))
    whole, stopped = _Blocks(columns), _Blocks(columns)
    inside = set(map(id, lm.layers[-1].attention.modules()))  # its q/k/v and o projections
    leaves = [m for m in lm.model.modules() if not list(m.children())]
    calls: list[nn.Module] = []
    hooks = [m.register_forward_pre_hook(lambda m, _: calls.append(m)) for m in leaves]
    reached = []
    try:
        with torch.no_grad():
            with StreamingAttention(lm, whole):
                lm.model(**batch)
            n_whole = len(calls)
            assert id(calls[-1]) not in inside  # the last layer's MLP (or norms) came after
            calls.clear()
            with StreamingAttention(lm, stopped, stop_after_last=True):
                lm.model(**batch)
                reached.append(True)
    finally:
        for h in hooks:
            h.remove()
    assert not reached
    assert len(calls) < n_whole and id(calls[-1]) in inside  # nothing after its attention
    assert stopped.done == whole.done == list(range(lm.n_layers))
    for layer in range(lm.n_layers):
        for a, b in zip(whole.blocks[layer], stopped.blocks[layer], strict=True):
            assert a[0] == b[0]
            for x, y in zip(a[1:], b[1:], strict=True):
                assert torch.equal(x, y)
    # the model still works outside, with its normal outputs
    with torch.no_grad():
        assert lm.model(**batch).last_hidden_state.shape[:2] == batch["input_ids"].shape


def test_stream_corpus_ends_each_forward_after_the_last_attention(lm: LoadedModel) -> None:
    """``stream_corpus`` (what ``headlab roles`` runs on) hands every layer's blocks to its
    consumers and never runs a module after the last layer's attention."""
    from headlab.models import stream_corpus

    _padding_side(lm)
    inside = set(map(id, lm.layers[-1].attention.modules()))
    passes: list[list[nn.Module]] = []  # the leaf modules each forward pass ran, in order
    leaves = [m for m in lm.model.modules() if not list(m.children())]
    hooks = [m.register_forward_pre_hook(lambda m, _: passes[-1].append(m)) for m in leaves]
    consumers: list[_Blocks] = []

    def consumer(batch: Any) -> _Blocks:
        consumers.append(_Blocks(torch.zeros(*batch.inputs["input_ids"].shape, 3)))
        passes.append([])
        return consumers[-1]

    try:
        skipped = stream_corpus(lm, TEXTS, consumer, batch_tokens=32)
    finally:
        for h in hooks:
            h.remove()
    assert len(consumers) >= 2 and len(skipped) < len(TEXTS)  # several batches
    assert all(c.done == list(range(lm.n_layers)) for c in consumers)
    assert all(ran and id(ran[-1]) in inside for ran in passes)


def test_head_outputs_equal_pattern_times_values(lm: LoadedModel) -> None:
    batch = encode(lm, TEXTS[:2])
    with torch.no_grad(), HeadCapture(lm) as cap:
        lm.model(**batch)
    real = batch["attention_mask"].bool()
    for layer in range(lm.n_layers):
        rec = cap.records[layer]
        pattern = cap.pattern(layer)  # (B, H, T, S)
        groups = lm.n_heads // rec.v.shape[1]
        values = rec.v.repeat_interleave(groups, dim=1).float()  # (B, H, S, D)
        expected = pattern @ values
        got = cap.head_output(layer)
        mask = real[:, None, :, None].expand_as(got)
        torch.testing.assert_close(got[mask], expected[mask], atol=1e-5, rtol=1e-4)


def test_contributions_sum_to_the_output_projection(lm: LoadedModel) -> None:
    batch = encode(lm, TEXTS[:1])
    seen: dict[int, torch.Tensor] = {}
    handle = lm.layers[0].out_proj.register_forward_hook(lambda m, a, out: seen.setdefault(0, out))
    try:
        with torch.no_grad(), HeadCapture(lm) as cap:
            lm.model(**batch)
    finally:
        handle.remove()
    bias = lm.adapter.out_proj_bias(lm.layers[0].out_proj)
    total = cap.contributions(0).sum(1) + (0 if bias is None else bias)
    torch.testing.assert_close(total, seen[0], atol=1e-5, rtol=1e-5)


def test_hooks_leave_outputs_bit_identical(lm: LoadedModel, family: tuple[str, Path]) -> None:
    batch = encode(lm, TEXTS)
    with torch.no_grad():
        reference = _sdpa(family[1])(**batch).last_hidden_state
        plain = lm.model(**batch).last_hidden_state
        with HeadCapture(lm) as cap:
            hooked = lm.model(**batch).last_hidden_state
        after = lm.model(**batch).last_hidden_state
    assert torch.equal(plain, reference)
    assert torch.equal(hooked, reference)
    assert torch.equal(after, reference)
    assert cap.records  # it did capture


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_equals_weight_surgery(
    lm: LoadedModel, family: tuple[str, Path], mode: str
) -> None:
    """Independent oracle: removing head h from the output projection's input is the same as
    zeroing its columns of the projection (zero) or moving W_h @ mean_h into the bias (mean)."""
    ablate = {0: [1], lm.n_layers - 1: [0, 2]}
    means = {layer: torch.randn(lm.n_heads, lm.head_dim) for layer in ablate}
    batch = encode(lm, TEXTS)
    with torch.no_grad(), HeadCapture(lm, ablate=ablate, ablation=mode, means=means):
        ablated = lm.model(**batch).last_hidden_state
    surgery = _sdpa(family[1])
    from headlab.models import wrap

    other = wrap(surgery, lm.tokenizer)
    d = lm.head_dim
    with torch.no_grad():
        for layer, heads in ablate.items():
            proj = other.layers[layer].out_proj
            weight = other.adapter.out_proj_weight(proj)  # (E, H*D), a view for GPT-2's Conv1D
            shift = torch.zeros(weight.shape[0])
            for h in heads:
                cols = slice(h * d, (h + 1) * d)
                if mode == "mean":
                    shift += weight[:, cols] @ means[layer][h]
                weight[:, cols] = 0
            if mode == "mean":
                if proj.bias is None:  # Llama-family o_proj: give it a bias to absorb the mean
                    proj.bias = torch.nn.Parameter(shift)
                else:
                    proj.bias += shift
        expected = surgery(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ablated[real], expected[real], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(
            ablated[real], lm.model(**batch).last_hidden_state[real], atol=1e-4
        )
