"""``headlab kv``: which KV heads need the whole context, and the smaller cache the others allow.

The request scores every KV head (:mod:`headlab.experiments.kv_scores`: attention outside the
sink and window on long text, copying from the needle on passkey prompts), chooses the
``fraction`` of KV heads with the lowest score (the least need for the whole context) as
*streaming*, and measures that choice with the mixed cache itself
(:mod:`headlab.experiments.kv_measure`): the bytes held after one context of text and its
perplexity, both beside the full cache's.

The chosen set is written as JSON (``--heads-out``) that a later run reads back
(``--heads-from``). Its ``full_attention_heads`` field is DuoAttention's layout (one row per
layer, one column per KV head, 1 for a head that keeps everything), the matrix its
``full_attention_heads.tsv`` holds.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headlab.causal.request import check_model
from headlab.datasets.bundled import sample_path
from headlab.datasets.passkey import passkeys
from headlab.errors import DataFormatError, InputError
from headlab.experiments.kv_measure import curve_point, read_text
from headlab.experiments.kv_scores import (
    SCORES,
    encode_passkey,
    fillers_for,
    outside_scores,
    retrieval_scores,
)
from headlab.models.kv_mixed import KVHead
from headlab.models.loading import LoadedModel
from headlab.models.names import DECODER
from headlab.outputs import check_files, write_text_atomic
from headlab.progress import NO_PROGRESS, Progress
from headlab.text import Part, table

#: the ways to choose streaming heads: a score, both (a head needs the whole context when
#: either score says so: their maximum), or at random
CHOICES = (*SCORES, "both", "random")
#: the head-set file's format tag
FORMAT = "headlab-kv-heads/1"
#: where the needle goes in passkey prompts, taken in turn
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True, kw_only=True)
class KVRequest:
    """What ``headlab kv`` is asked, its fields named as the command's flags; checked on
    creation, before any model loads.

    Attributes:
        model: a causal language model with its head (default: the bundled SmolLM2).
        score: what chooses the streaming heads: ``outside``, ``retrieval``, ``both`` (their
            maximum) or ``random``.
        fraction: the share of KV heads made streaming, 0 to 1.
        window, sink: what a streaming head keeps: the last ``window`` tokens (its query's
            own included) and the first ``sink``.
        context: tokens per text chunk and per passkey prompt.
        texts: text chunks scored (``outside``); the next one (else the last scored) is read
            through the caches.
        passkeys: passkey prompts scored (``retrieval``).
        text: a UTF-8 text file (default: the bundled TinyShakespeare sample).
        seed: the passkeys' keys and the random choice.
        heads_from: a head set written by ``--heads-out``, used instead of choosing.
        heads_out: where to write the chosen set (JSON).
        duo_out: a folder to write the set in DuoAttention's attention-pattern layout
            (``full_attention_heads.tsv`` and ``config.json``, :meth:`KVResult.write_duo`).
        curve: fractions at which to measure heads chosen by ``score`` and at random: KV
            bytes, passkey accuracy (``passkeys`` prompts not scored), perplexity and
            milliseconds per token over ``decode`` greedy tokens.
    """

    model: str = DECODER
    score: str = "both"
    fraction: float = 0.5
    window: int = 256
    sink: int = 4
    context: int = 1024
    texts: int = 2
    passkeys: int = 8
    text: str | None = None
    seed: int = 0
    heads_from: str | None = None
    heads_out: str | None = None
    duo_out: str | None = None
    curve: tuple[float, ...] | None = None
    decode: int = 16

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The checks of the class docstring, before any model loads."""
        if self.score not in CHOICES:
            raise InputError(f"--score must be one of {', '.join(CHOICES)}, got {self.score!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise InputError(f"--fraction must be between 0 and 1, got {self.fraction}")
        for flag, value, least in (
            ("--window", self.window, 1),
            ("--sink", self.sink, 0),
            ("--context", self.context, 2),
            ("--texts", self.texts, 1),
            ("--passkeys", self.passkeys, 1),
        ):
            if value < least:
                raise InputError(f"{flag} must be {least} or more, got {value}")
        if self.window + self.sink >= self.context:
            raise InputError(
                f"--window {self.window} with --sink {self.sink} covers the whole --context "
                f"{self.context}: nothing would be evicted (expected window + sink < context)"
            )
        check_files([("--heads-out", self.heads_out, ".json")])
        if self.duo_out is not None:
            where = Path(self.duo_out)
            if where.exists() and not where.is_dir():
                raise InputError(f"--duo-out {self.duo_out}: exists and is not a folder")
            if not where.parent.is_dir():
                raise InputError(f"--duo-out {self.duo_out}: folder {where.parent} does not exist")
        if self.text is not None and not Path(self.text).is_file():
            raise InputError(f"--text {self.text}: no such file")
        if self.heads_from is not None:
            read_heads(self.heads_from)
            if self.curve:
                raise InputError("--curve chooses heads by score: not with --heads-from")
        for fraction in self.curve or ():
            if not 0.0 <= fraction <= 1.0:
                raise InputError(f"--curve: fractions must be between 0 and 1, got {fraction}")
        if self.decode < 2:
            raise InputError(f"--decode must be 2 or more, got {self.decode}")
        check_model(self.model)  # an encoder has no next-token logits to read text with
        limit = _folder_limit(self.model)
        if limit is not None and self.context > limit:
            raise InputError(f"--context {self.context} is longer than the model's {limit}")

    def run(self, lm: LoadedModel, progress: Progress = NO_PROGRESS) -> KVResult:
        """Score, choose (or read) the streaming heads, and measure them (:func:`run_kv`)."""
        return run_kv(lm, self, progress)


def _folder_limit(model: str) -> int | None:
    """The longest input a model folder's config.json allows, when it says."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # loading says what is wrong
    return _limit(data)


def _limit(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return None


@dataclass(frozen=True)
class KVResult:
    """A ``headlab kv`` run (its JSON is ``--json``): the scores per KV head ``[layer][head]``
    (empty with ``--heads-from``), the streaming heads chosen, and their cost on one context of
    text beside the full cache's."""

    model: str
    n_layers: int
    n_kv_heads: int
    sink: int
    window: int
    context: int
    score: str
    fraction: float
    streaming: tuple[KVHead, ...]
    scores: dict[str, list[list[float]]] = field(default_factory=dict)
    kv_bytes: dict[str, int] = field(default_factory=dict)
    perplexity: dict[str, float] = field(default_factory=dict)
    heads_from: str | None = None
    curve: list[dict[str, Any]] = field(default_factory=list)

    def heads_json(self) -> dict[str, Any]:
        """The head set as ``--heads-out`` writes it."""
        streaming = set(self.streaming)
        return {
            "format": FORMAT,
            "model": self.model,
            "n_layers": self.n_layers,
            "n_kv_heads": self.n_kv_heads,
            "sink": self.sink,
            "window": self.window,
            "score": self.score,
            "fraction": self.fraction,
            "streaming": [list(h) for h in self.streaming],
            "full_attention_heads": [
                [0 if (layer, h) in streaming else 1 for h in range(self.n_kv_heads)]
                for layer in range(self.n_layers)
            ],
        }

    def write_duo(self, folder: str) -> None:
        """The set as DuoAttention's loader (``duo_attn.utils.load_attn_pattern``) reads it:
        ``full_attention_heads.tsv``, one tab-separated row per layer, 1 for a KV head that
        keeps everything, and ``config.json`` with ``sink_size`` and ``recent_size``."""
        where = Path(folder)
        where.mkdir(exist_ok=True)
        rows = self.heads_json()["full_attention_heads"]
        tsv = "".join("\t".join(str(v) for v in row) + "\n" for row in rows)
        write_text_atomic(where / "full_attention_heads.tsv", tsv)
        config = {"sink_size": self.sink, "recent_size": self.window}
        write_text_atomic(where / "config.json", json.dumps(config, indent=1) + "\n")

    def to_json(self) -> dict[str, Any]:
        return {
            **self.heads_json(),
            "context": self.context,
            "scores": self.scores,
            "kv_bytes": self.kv_bytes,
            "perplexity": self.perplexity,
            "heads_from": self.heads_from,
            "curve": self.curve,
        }


def read_heads(path: str) -> dict[str, Any]:
    """A head-set file written by ``--heads-out``, checked.

    Raises:
        InputError: no such file. DataFormatError: not a head set.
    """
    where = Path(path)
    if not where.is_file():
        raise InputError(f"--heads-from {path}: no such file")
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataFormatError(f"--heads-from {path}: not JSON ({exc})") from None
    ok = isinstance(data, dict) and data.get("format") == FORMAT
    heads = data.get("streaming") if ok else None
    if not isinstance(heads, list) or not all(
        isinstance(h, list) and len(h) == 2 and all(isinstance(i, int) for i in h) for h in heads
    ):
        raise DataFormatError(
            f"--heads-from {path}: expected a head set written by headlab kv --heads-out "
            f"(format {FORMAT}, streaming as [layer, KV head] pairs)"
        )
    return data


def choose(scores: torch.Tensor, fraction: float) -> tuple[KVHead, ...]:
    """The ``fraction`` of KV heads with the lowest scores ``(L, Hkv)`` (ties: the earlier
    head), in (layer, head) order."""
    n_layers, n_kv = scores.shape
    count = round(fraction * n_layers * n_kv)
    order = sorted(range(n_layers * n_kv), key=lambda i: (float(scores.flatten()[i]), i))
    return tuple(sorted(divmod(i, n_kv) for i in order[:count]))


def random_heads(n_layers: int, n_kv: int, fraction: float, seed: int) -> tuple[KVHead, ...]:
    """``fraction`` of the KV heads drawn at random (``seed``)."""
    every = [(layer, h) for layer in range(n_layers) for h in range(n_kv)]
    return tuple(sorted(random.Random(seed).sample(every, round(fraction * len(every)))))


def text_ids(lm: LoadedModel, request: KVRequest) -> list[torch.Tensor]:
    """Up to ``texts + 1`` chunks of ``context`` tokens ``(1, context)`` of the request's text:
    those scored, and one held out to read through the caches where the text is long enough."""
    source = request.text or sample_path("shakespeare")
    try:
        text = Path(source).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read --text {source}: {exc}") from None
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]  # (1, N)
    n = ids.shape[1] // request.context
    if n == 0:
        raise InputError(
            f"--text {source} has {ids.shape[1]} tokens, fewer than --context {request.context}"
        )
    return [ids[:, i * request.context : (i + 1) * request.context] for i in range(n)][
        : request.texts + 1
    ]


def _heads(
    request: KVRequest, choice: str, fraction: float, named: dict[str, torch.Tensor]
) -> tuple[KVHead, ...]:
    """The streaming heads ``choice`` (a score's name, or ``random``) picks at ``fraction``."""
    if choice == "random":
        n_layers, n_kv = named["outside"].shape
        return random_heads(n_layers, n_kv, fraction, request.seed)
    return choose(named[choice], fraction)


def _curve(
    lm: LoadedModel,
    request: KVRequest,
    named: dict[str, torch.Tensor],
    text: torch.Tensor,
    progress: Progress,
) -> list[dict[str, Any]]:
    """The full cache, then each ``--curve`` fraction chosen by ``--score`` and at random:
    bytes, passkeys (prompts drawn at ``seed + 1``, not those scored), perplexity, time."""
    fillers = fillers_for(lm, request.context)
    drawn = passkeys(request.passkeys, fillers, DEPTHS, seed=request.seed + 1)
    prompts = [encode_passkey(lm, p) for p in drawn]
    choices = list(dict.fromkeys((request.score, "random")))
    plan = [("full", 0.0)] + [(c, f) for f in request.curve or () for c in choices]
    points = []
    progress.start("the curve", total=len(plan), unit="points")
    for choice, fraction in plan:
        heads = [] if choice == "full" else _heads(request, choice, fraction, named)
        point = curve_point(
            lm,
            heads,
            sink=request.sink,
            window=request.window,
            text=text,
            prompts=prompts,
            decode_tokens=request.decode,
        )
        points.append({"choice": choice, "context": request.context, **point})
        progress.advance()
    progress.end()
    return points


def run_kv(lm: LoadedModel, request: KVRequest, progress: Progress = NO_PROGRESS) -> KVResult:
    """The run :class:`KVRequest` asks for, on ``lm`` (with its language-model head)."""
    limit = _limit(lm.model.config.to_dict())
    if limit is not None and request.context > limit:
        raise InputError(f"--context {request.context} is longer than the model's {limit}")
    n_layers, n_kv = lm.n_layers, lm.layout.n_kv_heads
    chunks = text_ids(lm, request)
    held_out = chunks[-1]  # the last chunk: not scored when the text had one more
    chunks = chunks[: request.texts]
    scores: dict[str, list[list[float]]] = {}
    named: dict[str, torch.Tensor] = {}
    if request.heads_from is not None:
        data = read_heads(request.heads_from)
        if (data.get("n_layers"), data.get("n_kv_heads")) != (n_layers, n_kv):
            raise InputError(
                f"--heads-from {request.heads_from}: written for {data.get('n_layers')} layers "
                f"x {data.get('n_kv_heads')} KV heads, this model has {n_layers} x {n_kv}"
            )
        streaming = tuple(sorted((int(a), int(b)) for a, b in data["streaming"]))
    else:
        outside = outside_scores(
            lm, chunks, sink=request.sink, window=request.window, progress=progress
        )
        fillers = fillers_for(lm, request.context)
        prompts = [
            encode_passkey(lm, p)
            for p in passkeys(request.passkeys, fillers, DEPTHS, seed=request.seed)
        ]
        retrieval = retrieval_scores(lm, prompts, progress=progress)
        scores = {"outside": outside.tolist(), "retrieval": retrieval.tolist()}
        named = {"outside": outside, "retrieval": retrieval}
        named["both"] = torch.maximum(outside, retrieval)
        streaming = _heads(request, request.score, request.fraction, named)
    curve = _curve(lm, request, named, held_out, progress) if request.curve else []
    progress.start("reading the text through the caches", total=2, unit="caches")
    reads = {}
    for name, heads in (("full", ()), ("mixed", streaming)):
        reads[name] = read_text(lm, held_out, heads, sink=request.sink, window=request.window)
        progress.advance()
    progress.end()
    result = KVResult(
        model=lm.name,
        n_layers=n_layers,
        n_kv_heads=n_kv,
        sink=request.sink,
        window=request.window,
        context=request.context,
        score=request.score,
        fraction=len(streaming) / (n_layers * n_kv),
        streaming=streaming,
        scores=scores,
        kv_bytes={k: r.kv_bytes for k, r in reads.items()},
        perplexity={k: r.perplexity for k, r in reads.items()},
        heads_from=request.heads_from,
        curve=curve,
    )
    if request.heads_out:
        write_text_atomic(request.heads_out, json.dumps(result.heads_json(), indent=1) + "\n")
    if request.duo_out:
        result.write_duo(request.duo_out)
    return result


def kv_text(data: dict[str, Any], top: int = 10) -> list[Part]:
    """What ``headlab kv`` prints: the saving and its cost, then the heads that most need the
    whole context by each score."""
    full, mixed = data["kv_bytes"]["full"], data["kv_bytes"]["mixed"]
    n = data["n_layers"] * data["n_kv_heads"]
    parts: list[Part] = [
        f"{data['model']}: {len(data['streaming'])} of {n} KV heads streaming "
        f"(sink {data['sink']} + window {data['window']}, chosen by "
        f"{'--heads-from' if data['heads_from'] else data['score']}), "
        f"on {data['context']} tokens of text",
        table(
            ("cache", "KV bytes", "perplexity"),
            [
                (name, f"{data['kv_bytes'][name]:,}", f"{data['perplexity'][name]:.3f}")
                for name in ("full", "mixed")
            ],
            caption=f"{1 - mixed / full:.1%} of the KV bytes saved" if full else None,
            right=(1, 2),
        ),
    ]
    if data.get("curve"):
        parts.append(
            table(
                ("heads", "streaming", "KV bytes", "passkey", "perplexity", "ms/token"),
                [
                    (
                        p["choice"],
                        f"{p['fraction']:.0%}",
                        f"{p['kv_bytes']:,}",
                        f"{p['passkey']:.0%}",
                        f"{p['perplexity']:.3f}",
                        f"{p['ms_per_token']:.1f}",
                    )
                    for p in data["curve"]
                ],
                title=f"the curve at {data['context']} tokens",
                right=(1, 2, 3, 4, 5),
            )
        )
    for name, grid in data["scores"].items():
        ranked = sorted(
            ((v, layer, h) for layer, row in enumerate(grid) for h, v in enumerate(row)),
            reverse=True,
        )[:top]
        parts.append(
            table(
                ("KV head", name),
                [(f"{layer}.{h}", f"{v:.3f}") for v, layer, h in ranked],
                title=f"heads that most need the whole context, by {name}",
                right=(1,),
            )
        )
    return parts
