"""Run sentences or a whole corpus through a model, in length-sorted padded batches."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from headlab.errors import InputError, TooLongError
from headlab.models.capture import HeadCapture
from headlab.models.loading import LoadedModel
from headlab.models.streaming import BlockConsumer, StreamingAttention
from headlab.models.words import Alignment, align
from headlab.progress import NO_PROGRESS, Progress

logger = logging.getLogger(__name__)


def encode(lm: LoadedModel, texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """Tokenize ``texts`` into one padded batch on the model's device (errors if too long)."""
    if not texts or any(not t.strip() for t in texts):
        raise InputError("texts must be a non-empty list of non-empty strings")
    limit = lm.max_positions
    tok = lm.tokenizer
    if tok.pad_token is None:  # GPT-2 style tokenizers have none; padding is masked anyway
        tok.pad_token = tok.eos_token
    # right padding: token i of every row sits at position i, as word alignments assume
    batch = tok(
        list(texts), return_tensors="pt", padding=True, padding_side="right", truncation=False
    )
    if limit is not None and batch["input_ids"].shape[1] > limit:
        raise TooLongError(
            f"input is {batch['input_ids'].shape[1]} tokens long; {lm.name} takes at most {limit} "
            "(shorten it: headlab does not truncate silently)"
        )
    accepted = _forward_arguments(lm.model)
    return {k: v.to(lm.device) for k, v in batch.items() if k in accepted}


def _forward_arguments(model: Any) -> set[str]:
    """Named arguments of the model's forward (DistilBERT, say, takes no token_type_ids)."""

    params = inspect.signature(model.forward).parameters
    return {name for name, p in params.items() if p.kind is not p.VAR_KEYWORD}


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One padded batch handed to a corpus consumer.

    Attributes:
        indices: position of each row's sentence in the corpus.
        alignments: word alignment of each row.
        inputs: the tokenized batch (``input_ids``, ``attention_mask``...).
        capture: the :class:`HeadCapture` of this batch's forward pass (``None`` before the
            forward pass, as :func:`stream_corpus` hands batches out).
        lengths: real (unpadded) token count of each row.
    """

    indices: list[int]
    alignments: list[Alignment]
    inputs: dict[str, torch.Tensor]
    capture: Any
    lengths: list[int]


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A sentence left out, and why: ``reason`` the error's message, ``kind`` its kind in a
    few words (:attr:`headlab.errors.InputError.kind`; the message when the error has none)."""

    index: int
    reason: str
    kind: str = ""


def run_corpus(
    lm: LoadedModel,
    sentences: Iterable[Sequence[str] | str],
    consume: Callable[[Batch], None],
    *,
    batch_tokens: int = 4096,
    layers: Iterable[int] | None = None,
    record_head_outputs: bool = False,
    progress: Progress | None = None,
    stage: str = "sentences",
) -> list[Skipped]:
    """Stream sentences (raw strings or lists of words) through the model.

    Sentences are aligned to tokens, sorted by length and packed into padded batches of about
    ``batch_tokens`` tokens; ``consume`` gets each :class:`Batch` while its capture is live and
    should keep only what it needs, so memory does not grow with the corpus. Sentences that
    cannot be aligned or are too long are skipped and returned with the reason.

    The whole run is one stage of ``progress`` named ``stage``, counted in sentences once
    per batch.
    """
    skipped: list[Skipped] = []
    for batch in _batches(lm, sentences, batch_tokens, progress, stage, skipped):
        with (
            torch.inference_mode(),
            HeadCapture(lm, layers=layers, record_head_outputs=record_head_outputs) as cap,
        ):
            lm.model(**batch.inputs)
        consume(replace(batch, capture=cap))
    return skipped


def stream_corpus(
    lm: LoadedModel,
    sentences: Iterable[Sequence[str] | str],
    consumer: Callable[[Batch], BlockConsumer],
    *,
    batch_tokens: int = 4096,
    block_elements: int = 1 << 20,
    dtype: torch.dtype | None = None,
    progress: Progress | None = None,
    stage: str = "sentences",
    part: tuple[int, int] = (0, 1),
    skip: int = 0,
    after_batch: Callable[[], None] | None = None,
    unit: str = "sentences",
) -> list[Skipped]:
    """Like :func:`run_corpus`, but each batch's attention is computed in query blocks that a
    :class:`~headlab.models.streaming.BlockConsumer` sees during the forward pass.

    ``consumer(batch)`` is called before the batch's forward pass (``batch.capture`` is
    ``None``) and returns what gets the blocks; no pattern is kept or recomputed afterwards.
    Each forward pass ends after the last layer's attention (nothing later changes a pattern).
    ``progress`` and ``stage`` as in :func:`run_corpus` (the stage counts the items of the
    batches this call runs, in ``unit``: sentences, or GAP's passages).

    ``part`` ``(rank, world)``: run only every ``world``-th batch from ``rank`` on (the batches
    are those of the whole corpus, so every sentence is batched as in one process); ``skip``:
    leave out that many of these first (already done, by a run that resumes); ``after_batch``
    is called after each batch that ran. The skipped sentences are those of the whole corpus.
    """
    skipped: list[Skipped] = []
    for batch in _batches(
        lm, sentences, batch_tokens, progress, stage, skipped, part=part, skip=skip, unit=unit
    ):
        blocks = consumer(batch)
        with (
            torch.inference_mode(),
            StreamingAttention(
                lm, blocks, block_elements=block_elements, dtype=dtype, stop_after_last=True
            ),
        ):
            lm.model(**batch.inputs)
        if after_batch is not None:
            after_batch()
    return skipped


def _batches(
    lm: LoadedModel,
    sentences: Iterable[Sequence[str] | str],
    batch_tokens: int,
    progress: Progress | None,
    stage: str,
    skipped: list[Skipped],
    *,
    part: tuple[int, int] = (0, 1),
    skip: int = 0,
    unit: str = "sentences",
) -> Iterator[Batch]:
    """Aligned, length-sorted, padded batches (``capture`` None); unalignable or too long
    sentences go to ``skipped`` with the reason. Each batch advances ``progress`` once its
    consumer is done with it (the stage ends after the last). ``part`` and ``skip``: see
    :func:`stream_corpus`."""
    limit = lm.max_positions
    items: list[tuple[int, Alignment]] = []
    for i, sentence in enumerate(sentences):
        try:
            if isinstance(sentence, str):
                items.append((i, align(lm.tokenizer, text=sentence, max_tokens=limit)))
            else:
                items.append((i, align(lm.tokenizer, words=list(sentence), max_tokens=limit)))
        except InputError as exc:
            skipped.append(Skipped(index=i, reason=str(exc), kind=exc.kind or str(exc)))
    if skipped:
        logger.info("skipped %d sentences", len(skipped))
    items.sort(key=lambda item: item[1].n_tokens)
    rank, world = part
    batches = list(_pack(items, batch_tokens))[rank::world][skip:]
    report = NO_PROGRESS if progress is None else progress
    report.start(stage, sum(map(len, batches)), unit)
    for chunk in batches:
        inputs = encode(lm, [a.text for _, a in chunk])
        lengths = inputs["attention_mask"].sum(1).tolist()
        yield Batch(
            indices=[i for i, _ in chunk],
            alignments=[a for _, a in chunk],
            inputs=inputs,
            capture=None,
            lengths=[int(n) for n in lengths],
        )
        report.advance(len(chunk))
    report.end()


def _pack(
    items: list[tuple[int, Alignment]], batch_tokens: int
) -> Iterator[list[tuple[int, Alignment]]]:
    chunk: list[tuple[int, Alignment]] = []
    for item in items:
        longest = max([item[1].n_tokens] + [a.n_tokens for _, a in chunk])
        if chunk and longest * (len(chunk) + 1) > batch_tokens:
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


def last_logits(lm: LoadedModel, ids: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``(B, V)`` at the last position of ``ids`` ``(B, T)``.

    Only the last position goes through the language-model head when the model's forward takes
    ``logits_to_keep`` (the head of a 49k-token vocabulary is a fifth of SmolLM2's forward).

    Raises:
        InputError: the model was loaded without its language-model head.
    """
    if lm.model.get_output_embeddings() is None:
        raise InputError(f"{lm.name} was loaded without its language-model head")
    keep = "logits_to_keep" in inspect.signature(lm.model.forward).parameters
    out = lm.model(input_ids=ids, **({"logits_to_keep": 1} if keep else {}))
    return out.logits[:, -1]
