"""The attention engine inside real models, on every device: StreamingAttention, HeadCapture's
patterns and the model's own sdpa agree on every row, padded rows under a sliding window
included; captures nest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tests.models.tiny import build

from headlab.errors import HeadlabError
from headlab.models import HeadCapture, LoadedModel, StreamingAttention, encode, load

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

#: lengths 12, 3 and 5 tokens with the MiniLM tokenizer's [CLS]/[SEP]: rows 3+ of the second
#: sentence see no key under a window of 2 (both keys padding)
TEXTS = ["The chef who trained in Paris prepared the fish.", "Hi", "A short one"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build("mistral", tmp_path_factory.mktemp("mistral-window-2"), sliding_window=2)


def _sdpa(folder: Path, device: str) -> torch.nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), local_files_only=True).eval().to(device)


class _Blocks:
    def __init__(self) -> None:
        self.blocks: dict[int, list[tuple[torch.Tensor, ...]]] = {}
        self.done: list[int] = []

    def columns(self, layer: int) -> torch.Tensor | None:
        return None

    def block(self, layer: int, start: int, weights: torch.Tensor, *parts: Any) -> None:
        entropy, top, _ = parts
        self.blocks.setdefault(layer, []).append((weights.clone(), entropy.clone(), top.clone()))

    def layer_done(self, layer: int) -> None:
        self.done.append(layer)


def _batch(lm: LoadedModel, device: str) -> dict[str, torch.Tensor]:
    lm.tokenizer.padding_side = "right"
    return {k: v.to(device) for k, v in encode(lm, TEXTS).items()}


@pytest.mark.parametrize("device", DEVICES)
def test_padded_rows_under_a_sliding_window_agree_everywhere(
    folder: Path, device: str, kernels: str
) -> None:
    """On a row that sees no key (a padded query whose whole window is padding), the model's
    output through StreamingAttention equals sdpa's (zero head output), HeadCapture's pattern
    is zeros, and the blocks report zero weights, entropy 0 and largest weight 0; on every
    other row all three agree too."""
    if device != "cpu" and kernels != "torch":
        pytest.skip("the native kernels run on the CPU only")
    lm = load(folder, device=device)
    batch = _batch(lm, device)
    consumer = _Blocks()
    with torch.no_grad():
        plain = _sdpa(folder, device)(**batch).last_hidden_state
        with HeadCapture(lm) as cap:
            captured = lm.model(**batch).last_hidden_state
        with StreamingAttention(lm, consumer, block_elements=64):
            ours = lm.model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()  # (B, T)
    ends = real.sum(-1)
    pos = torch.arange(real.shape[1], device=device)
    no_key = pos[None, :] >= ends[:, None] + 1  # (B, T): window of 2, both keys padding
    assert bool(no_key.any())
    assert (ours - plain).abs().max() < 1e-5  # every row, the empty ones included
    assert torch.equal(captured, plain)
    for layer in range(lm.n_layers):
        pattern = cap.pattern(layer)  # (B, H, T, S)
        rows = no_key[:, None].expand(-1, pattern.shape[1], -1)  # (B, H, T)
        assert bool((pattern[rows] == 0).all())
        rec = cap.records[layer]
        group = pattern.shape[1] // rec.v.shape[1]
        mixed = pattern @ rec.v.float().repeat_interleave(group, 1)  # (B, H, T, D)
        assert (mixed - rec.head_output.float()).abs().max() < 1e-5  # sdpa's head outputs
        n_keys = pattern.shape[-1]  # a causal block is handed the keys it can see
        blocks = consumer.blocks[layer]
        weights = torch.cat([F.pad(b[0], (0, n_keys - b[0].shape[-1])) for b in blocks], 2)
        entropy = torch.cat([b[1] for b in blocks], 2)
        top = torch.cat([b[2] for b in blocks], 2)
        assert (weights - pattern).abs().max() < 1e-5
        assert bool((entropy[rows] == 0).all()) and bool((top[rows] == 0).all())
        assert torch.isfinite(entropy).all()


@pytest.mark.parametrize("device", DEVICES)
def test_nested_captures_compose(folder: Path, device: str) -> None:
    """A HeadCapture inside another, and inside StreamingAttention: every context sees every
    call (the outer one is not dropped) and the outputs stay the model's."""
    lm = load(folder, device=device)
    batch = _batch(lm, device)
    consumer = _Blocks()
    with torch.no_grad():
        plain = lm.model(**batch).last_hidden_state
        with HeadCapture(lm) as outer:
            with HeadCapture(lm, layers=[1]) as inner:
                both = lm.model(**batch).last_hidden_state
            with StreamingAttention(lm, consumer) as _, HeadCapture(lm) as inside:
                streamed = lm.model(**batch).last_hidden_state
    assert torch.equal(both, plain)
    assert (streamed - plain).abs().max() < 1e-5
    assert sorted(outer.records) == [0, 1] and sorted(inner.records) == [1]
    assert sorted(inside.records) == [0, 1] and consumer.done == [0, 1]
    # the outer capture saw both forward passes (the streamed one last), as the inner ones did
    assert torch.equal(outer.pattern(1), inside.pattern(1))
    assert (outer.pattern(1) - inner.pattern(1)).abs().max() < 1e-5


def test_two_contexts_computing_the_output_are_refused(folder: Path) -> None:
    """Two StreamingAttentions on one model would both compute each layer's output: a clear
    error, and the outer one still works afterwards."""
    lm = load(folder)
    batch = _batch(lm, "cpu")
    consumer = _Blocks()
    with StreamingAttention(lm, consumer):
        with (
            pytest.raises(HeadlabError, match="at most one headlab context"),
            StreamingAttention(lm, _Blocks()),
        ):
            pass
        with torch.no_grad():
            lm.model(**batch)
    assert consumer.done == [0, 1]


def test_a_float64_model_gets_float64_patterns(tmp_path: Path) -> None:
    """A model loaded in float64 gets its patterns in float64, equal to HF eager attention's in
    float64 far below float32's rounding (BERT's eager softmax runs in the model's dtype; the
    Llama family's upcasts to float32, so it could not tell)."""
    from transformers import AutoModel

    path = build("bert", tmp_path / "bert")
    lm = load(path, dtype=torch.float64)
    batch = encode(lm, ["The chef who trained in Paris prepared the fish.", "A cat."])
    with torch.no_grad(), HeadCapture(lm) as cap:
        lm.model(**batch)
    eager = AutoModel.from_pretrained(path, attn_implementation="eager", dtype=torch.float64)
    with torch.no_grad():
        maps = eager(**batch, output_attentions=True).attentions
    for layer in range(lm.n_layers):
        pattern = cap.pattern(layer)
        assert pattern.dtype == torch.float64
        real = batch["attention_mask"].bool()[:, None, :, None]  # (B, 1, T, 1) unpadded rows
        gap = ((pattern - maps[layer]).abs() * real).max()
        assert gap < 1e-12, (layer, float(gap))


def test_soft_capped_scores_stream_as_eager_computes_them() -> None:
    """Gemma 2 caps its scaled scores, ``cap * tanh(s / cap)``, before the mask: the blocks
    StreamingAttention hands out equal eager's attentions on every real row and the model's
    output is unchanged. A cap of 0.5 moves the weights far more than the tolerance, so a
    cap the engine ignored would fail here."""
    from tests.models.architectures import build_model, inputs

    from headlab.models import wrap

    def sharp(model: Any) -> Any:  # random tiny weights give scores near 0: scale them up
        with torch.no_grad():
            for layer in model.layers:
                layer.self_attn.q_proj.weight.mul_(30.0)
        return model

    lm = wrap(sharp(build_model("gemma2", attn_logit_softcapping=0.5)), None, name="gemma2")
    batch = inputs(lm.model)
    eager = sharp(build_model("gemma2", attn_implementation="eager", attn_logit_softcapping=0.5))
    loose = sharp(build_model("gemma2", attn_implementation="eager", attn_logit_softcapping=1e6))
    consumer = _Blocks()
    with torch.no_grad():
        expected = eager(**batch, output_attentions=True)
        far = loose(**batch, output_attentions=True).attentions
        plain = lm.model(**batch).last_hidden_state
        with StreamingAttention(lm, consumer, block_elements=64):
            ours = lm.model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()[:, None, :, None]  # (B, 1, T, 1): real query rows
    assert (ours - plain).abs().max() < 1e-5
    for layer, pattern in enumerate(expected.attentions):  # (B, H, T, S)
        blocks = consumer.blocks[layer]
        n_keys = pattern.shape[-1]
        weights = torch.cat([F.pad(b[0], (0, n_keys - b[0].shape[-1])) for b in blocks], 2)
        assert ((weights - pattern) * real).abs().max() < 1e-5
        assert ((far[layer] - pattern) * real).abs().max() > 1e-3  # the cap matters here


def test_streaming_builds_no_key_value_cache(folder: Path) -> None:
    """A decoder's forward keeps every layer's keys and values by default; under
    StreamingAttention nothing reads them, so none is built (memory), and the model's own
    setting is back afterwards, on an error too."""
    lm = load(folder)
    batch = _batch(lm, "cpu")
    assert lm.model.config.use_cache
    with torch.no_grad():
        with StreamingAttention(lm, _Blocks()):
            streamed = lm.model(**batch)
        plain = lm.model(**batch)
        with pytest.raises(RuntimeError), StreamingAttention(lm, _Blocks()):
            raise RuntimeError("stop")
    assert streamed.past_key_values is None
    assert plain.past_key_values is not None and lm.model.config.use_cache is True
