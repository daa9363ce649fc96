"""Large CPU tensors on transparent huge pages.

A fresh CPU tensor above glibc's largest mmap threshold (32 MiB on 64-bit Linux) is always a
new anonymous mapping, which the kernel faults in one 4 KiB page at a time on first touch. For
the ``(B, H, T, S)`` attention weights of a long input, those faults nearly double the time of
the matrix product that writes them: ``q k^T`` for 12 heads of 1,024 tokens took 20 ms into a
fresh tensor and 11 ms into one advised ``MADV_HUGEPAGE`` (faulted 2 MiB at a time). PyTorch offers
the same for every allocation of a process (``THP_MEM_ALLOC_ENABLE=1``); :func:`empty` does it
for the tensors that gain from it. Smaller tensors come from the allocator's reused memory,
which costs no fault at all, so they are left to it.

Set ``headlab.attention.memory.HUGE_PAGES = False`` to turn it off (for example where memory is
so fragmented that the kernel's compaction for huge pages costs more than it saves).

:func:`available_bytes` says how much memory a device still has, for the checks that refuse a
size before it runs out (``experiment cost``'s grid, a text's patterns).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from pathlib import Path

import torch

#: the share of :func:`available_bytes` a run may plan to fill (the rest: Python, torch, the OS);
#: every check that refuses a size before it runs out plans against it
MEMORY_SHARE = 0.8

#: from this many bytes a tensor goes on huge pages (glibc maps every allocation this large
#: afresh; smaller ones usually reuse memory that is already faulted in)
HUGE_FROM = 32 << 20

_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_pages_available() -> bool:
    """Linux with transparent huge pages in ``always`` or ``madvise`` mode."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return False
    try:
        mode = _THP_MODE.read_text()
    except OSError:
        return False
    return "[never]" not in mode


HUGE_PAGES = _huge_pages_available()


def empty(shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized tensor like ``torch.empty``; on huge pages when it is a CPU tensor of at
    least :data:`HUGE_FROM` bytes and the system has them. The memory is returned to the system
    when the tensor (and every view of it) is gone."""
    n_bytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or n_bytes < HUGE_FROM or not HUGE_PAGES:
        return torch.empty(shape, dtype=dtype, device=device)
    region = mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # a kernel that refuses the advice still gives a working mapping, in 4 KiB pages
    with contextlib.suppress(OSError):
        region.madvise(mmap.MADV_HUGEPAGE)
    # the tensor holds a reference to the mapping, which is unmapped with its last view
    return torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(shape)


def available_bytes(device: torch.device) -> int | None:
    """The memory a run on ``device`` may still take: on CUDA the free bytes the driver reports
    (``torch.cuda.mem_get_info``); on the CPU Linux's ``MemAvailable`` (free memory and the
    caches the kernel would give back), else the free physical pages; ``None`` where the system
    does not say."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
