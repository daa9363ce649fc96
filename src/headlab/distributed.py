"""Corpus runs across processes, GPUs and machines, through :mod:`torch.distributed`.

Under ``torchrun`` (``WORLD_SIZE`` > 1) each process, a *rank*, runs every ``world``-th batch of
the corpus, adds up its own sums, and the sums are all-reduced (in float64) before anything is
scored; rank 0 alone writes the output. The batches are those of one process (the whole corpus
is aligned and packed on every rank, which is cheap next to the forward passes), so each
sentence's values are the same bits as in one process and only the order of the float64 sums
changes. Backends: NCCL when the statistics run on CUDA, gloo on CPUs.

A rank that fails says so at the next check (:func:`failures`): every rank then stops with one
line naming the rank and its error, and nothing is written. A rank that dies outright is noticed
by the others' next collective (torchrun also ends them), or after :data:`TIMEOUT_S`.

One process (no ``WORLD_SIZE``, or 1) never touches :mod:`torch.distributed`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Protocol

import torch

from headlab.errors import DistributedError, HeadlabError

#: how long a rank waits for the others at a collective before it gives up (seconds);
#: ``HEADLAB_DIST_TIMEOUT`` overrides it
TIMEOUT_S = 1800.0


def launched() -> bool:
    """Whether this process was started as one of several (``WORLD_SIZE`` > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def part() -> tuple[int, int]:
    """``(rank, world size)`` of the initialized process group; ``(0, 1)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def writes() -> bool:
    """Whether this process writes output (rank 0, or the only process)."""
    return part()[0] == 0


def local_device(device: torch.device) -> torch.device:
    """``device`` for this rank: a CUDA device without an index becomes ``cuda:LOCAL_RANK``."""
    if launched() and device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


@contextmanager
def group(device: torch.device) -> Iterator[None]:
    """Join the process group of a ``torchrun`` launch for the duration of the block (NCCL for
    a CUDA ``device``, else gloo); nothing at all in one process."""
    if not launched():
        yield
        return
    if not torch.distributed.is_available():
        raise DistributedError("WORLD_SIZE > 1, but this torch was built without distributed")
    timeout = float(os.environ.get("HEADLAB_DIST_TIMEOUT", TIMEOUT_S))
    backend = "gloo"
    if device.type == "cuda":
        backend = "nccl"
        torch.cuda.set_device(local_device(device))
    try:
        torch.distributed.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))
    except Exception as exc:
        raise DistributedError(f"could not join the process group: {_line(exc)}") from None
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _device() -> torch.device:
    """Where collectives' tensors live: the current CUDA device under NCCL, else the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _collective(what: str, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except HeadlabError:
        raise
    except Exception as exc:  # a rank that died: gloo and NCCL raise RuntimeError subclasses
        raise DistributedError(
            f"another rank stopped while the ranks were {what}: {_line(exc)}"
        ) from None


@contextmanager
def failures(what: str) -> Iterator[None]:
    """Run the block on every rank, then check that every rank got through it: if any raised,
    every rank raises one :class:`DistributedError` naming the first failed rank and its error
    (so that no rank waits at a collective for one that will never come). In one process the
    block's own errors pass through unchanged."""
    world = part()[1]
    if world == 1:
        yield
        return
    error: BaseException | None = None
    try:
        yield
    except Exception as exc:
        error = exc
    messages: list[Any] = [None] * world
    _collective(
        f"checking {what}",
        torch.distributed.all_gather_object,
        messages,
        None
        if error is None
        else _line(error)
        if not isinstance(error, HeadlabError)
        else str(error),
    )
    failed = [(r, m) for r, m in enumerate(messages) if m is not None]
    if failed:
        r, message = failed[0]
        raise DistributedError(f"rank {r} of {world} failed during {what}: {message}") from error


class Sums(Protocol):
    """Named float64 sums (:class:`headlab.roles.bootstrap.Sums` is one)."""

    values: dict[str, torch.Tensor]

    @property
    def device(self) -> torch.device: ...

    def gather(self) -> Any: ...


def reduce_sums(*all_sums: Sums | None) -> None:
    """Add up each :class:`~headlab.roles.bootstrap.Sums` over the ranks, in place, in float64
    (one all-reduce for all of them). A sum that some rank never started (it got no batch that
    adds to it) counts as zeros there."""
    world = part()[1]
    if world == 1:
        return
    for s in all_sums:
        if s is not None:
            s.gather()  # the layer sums of a model spread over devices, into one tensor each
    shapes = [{n: tuple(v.shape) for n, v in s.values.items()} if s else {} for s in all_sums]
    gathered: list[Any] = [None] * world
    _collective("comparing sums", torch.distributed.all_gather_object, gathered, shapes)
    device = _device()
    flat, layout = [], []
    for i, sums in enumerate(all_sums):
        if sums is None:
            continue
        names: dict[str, tuple[int, ...]] = {}
        for other in gathered:
            names.update(other[i])
        for name in sorted(names):
            value = sums.values.get(name)
            if value is None:
                value = torch.zeros(names[name], dtype=torch.float64)
            flat.append(value.reshape(-1).to(device, torch.float64))
            layout.append((sums, name, names[name]))
    if not flat:
        return
    total = torch.cat(flat)
    _collective("adding up sums", torch.distributed.all_reduce, total)
    offset = 0
    for sums, name, shape in layout:
        n = 1
        for d in shape:
            n *= d
        sums.values[name] = total[offset : offset + n].view(shape).to(sums.device)
        offset += n


def reduce_counts(counts: Counter[str]) -> Counter[str]:
    """The sum over the ranks of each rank's ``counts`` (in one process: ``counts``)."""
    world = part()[1]
    if world == 1:
        return counts
    gathered: list[Any] = [None] * world
    _collective("adding up counts", torch.distributed.all_gather_object, gathered, dict(counts))
    total: Counter[str] = Counter()
    for other in gathered:
        total.update(other)
    return total


def reduce_tensor(value: torch.Tensor) -> torch.Tensor:
    """The sum over the ranks of ``value`` (float64 on the way; back on ``value``'s device and
    dtype)."""
    world = part()[1]
    if world == 1:
        return value
    total = value.to(_device(), torch.float64)
    _collective("adding up scores", torch.distributed.all_reduce, total)
    return total.to(value.device, value.dtype)
