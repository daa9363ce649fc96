"""Peak memory of one call on any device: on CUDA ``torch.cuda.max_memory_allocated``; on the
CPU the bytes the allocator hands out, from ``torch.profiler`` with ``profile_memory=True`` (the
peak of the running sum of the allocations and frees it records), with headlab's huge-page
tensors sent through the allocator for that call so that none escapes, and the profiler's own
C++ log kept off stderr."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from headlab.attention import memory

#: how :func:`peak_bytes` measures, by device type
MEMORY_METHOD = {
    "cuda": "torch.cuda.max_memory_allocated over the call, minus what was allocated before",
    "cpu": (
        "torch.profiler(profile_memory=True): peak of the running sum of every allocation and "
        "free the CPU allocator recorded during the call, in time order"
    ),
}


@contextlib.contextmanager
def _allocator_only() -> Iterator[None]:
    """Send headlab's large CPU tensors through torch's allocator (no huge-page mappings), so
    that the profiler sees every byte."""
    saved = memory.HUGE_PAGES
    memory.HUGE_PAGES = False
    try:
        yield
    finally:
        memory.HUGE_PAGES = saved


#: a line of the profiler's own C++ log (Kineto), as torch 2.13 writes to stderr at each start
#: and stop: ``USDT:2026-12-07 16:34:04 6757:6757 SyncActivityProfilerHandler.cpp:52] ...``
_PROFILER_LOG = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_profiler_log() -> Iterator[None]:
    """Keep the profiler's own log lines off stderr while it starts or stops (they are
    written by C++ to file descriptor 2, under Python's ``sys.stderr``; ``KINETO_LOG_LEVEL``
    is read once, when torch is imported, so too late for a library to set). Any other line
    written meanwhile is passed on to stderr."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (a closed stderr): nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode("utf-8", "replace")
    kept = [line for line in text.splitlines(keepends=True) if not _PROFILER_LOG.match(line)]
    if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated while ``fn()`` runs, beyond what was allocated before (see
    :data:`MEMORY_METHOD`). The result of ``fn`` counts while it lives, then is dropped."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del result
        return int(peak)
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _allocator_only():
        with _without_profiler_log():
            prof.start()
        try:
            result = fn()
            del result
        finally:
            with _without_profiler_log():
                prof.stop()
    # every allocation (+) and free (-) the CPU allocator reported, in time order
    results: Any = prof.profiler.kineto_results if prof.profiler is not None else None
    records = results.events() if results is not None else []
    changes = sorted((e.start_ns(), e.nbytes()) for e in records if e.name() == "[memory]")
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    return int(peak)
