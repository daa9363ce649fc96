"""Build, cache and load of ``rows.c`` (see :mod:`headlab.native`), and :func:`parallel`, the
thread split of a kernel's rows."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from headlab.cache import cache_root
from headlab.outputs import write_bytes_atomic

SOURCE = Path(__file__).with_name("rows.c")
#: tried first; without it (a compiler with no OpenMP), the kernels run on one thread each
#: and :func:`parallel` splits them across Python threads
OPENMP = ("-fopenmp",)
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp-simd",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-std=c99",
    "-shared",
    "-fPIC",
)

#: how the reasons of kernels that are off by design begin
_CHOSEN = ("HEADLAB_NATIVE=0", "not an x86 CPU")
_lock = threading.Lock()
_state: dict[str, Any] = {}

#: each kernel's arguments: p a pointer, q a pointer or None, i int64, b int32, d double
_SIGNATURES = {
    "softmax_rows": "ppppiii",
    "attend_rows": "pppppiiiiiiiqbiqiqiiidii",
    "word_argmax_rows": "piiipiipppippippppbii",
    "positional_rows": "pppiiiiippii",
}
_CTYPES = {
    "p": ctypes.c_void_p,
    "q": ctypes.c_void_p,
    "i": ctypes.c_int64,
    "b": ctypes.c_int32,
    "d": ctypes.c_double,
}


def cache_dir() -> Path:
    """Where built kernels are kept: :func:`headlab.cache.cache_root`."""
    return cache_root()


def _cpu_key() -> str:
    """What ``-march=native`` depends on: a library built on another CPU may not run here."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: seconds the compiler may take before headlab gives up on it (``$HEADLAB_CC_TIMEOUT``)
COMPILER_TIMEOUT = 60.0


class _CompilerHung(OSError):
    """The compiler did not finish in time (no retry without OpenMP: it would hang again)."""


def _compiler() -> list[str]:
    """The C compiler's command line: ``$CC`` split as a shell splits words (``CC="gcc -O0"``
    works), else ``cc`` or ``gcc``; empty when there is none."""
    words = shlex.split(os.environ.get("CC", ""))
    if words:
        return words
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else []


def _timeout() -> float:
    text = os.environ.get("HEADLAB_CC_TIMEOUT")
    if not text:
        return COMPILER_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also NaN
        raise OSError(f"HEADLAB_CC_TIMEOUT must be a positive number of seconds, got {text!r}")
    return value


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (only we may write it) or check that an existing one is ours and that
    nobody else can write it: a library placed there by someone else would run as us."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError as err:
        raise OSError(
            f"cannot write to {folder} ({err.strerror}); set HEADLAB_CACHE to a writable folder"
        ) from err
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise OSError(
            f"the kernel cache {folder} belongs to another user (uid {info.st_uid}); "
            "set HEADLAB_CACHE to a folder of your own"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(
            f"the kernel cache {folder} can be written by others (mode "
            f"{stat.S_IMODE(info.st_mode):o}); set HEADLAB_CACHE to a folder only you can write"
        )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checksum_path(library: Path) -> Path:
    """The sidecar holding a built library's sha256 (written after the library)."""
    return library.with_name(library.name + ".sha256")


def _verified(library: Path) -> bool:
    """Whether ``library`` is whole and the one headlab built: its sha256 matches the sidecar
    (a truncated, overwritten or planted file does not, and is built again)."""
    try:
        return _checksum_path(library).read_text().strip() == _sha256(library)
    except OSError:
        return False


def _build(compiler: list[str], flags: tuple[str, ...]) -> Path:
    """The shared library for this source, flags and CPU: the cached one when its checksum
    holds, else built now (into a temporary file renamed into place, then its checksum)."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(
        b"\0".join(
            [source, " ".join(flags).encode(), "\0".join(compiler).encode(), _cpu_key().encode()]
        )
    ).hexdigest()[:16]
    folder = cache_dir()
    _private_folder(folder)
    target = folder / f"rows-{key}{'.dylib' if sys.platform == 'darwin' else '.so'}"
    if target.exists() and _verified(target):
        return target
    timeout = _timeout()
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rows-", suffix=target.suffix)
    except OSError as err:
        raise OSError(
            f"cannot write to {folder} ({err.strerror}); set HEADLAB_CACHE to a writable folder"
        ) from err
    os.close(fd)
    try:
        try:
            done = subprocess.run(
                [*compiler, *flags, "-o", tmp, str(SOURCE), "-lm"],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as err:
            raise _CompilerHung(
                f"{shlex.join(compiler)} did not finish in {timeout:g} s "
                "(HEADLAB_CC_TIMEOUT sets the limit)"
            ) from err
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise OSError(f"{shlex.join(compiler)} failed: {last}")
        digest = _sha256(Path(tmp))
        os.replace(tmp, target)  # atomic: a concurrent build or reader never sees half a file
        write_bytes_atomic(_checksum_path(target), digest.encode())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _parse_signatures(table: str) -> dict[str, str]:
    """``"name:sig;name:sig"`` as exported by ``headlab_signatures()`` in ``rows.c``."""
    out = {}
    for item in table.split(";"):
        name, _, args = item.strip().partition(":")
        if name:
            out[name] = args
    return out


def _signature_mismatch(table: str) -> str:
    """Why the library's exported argument table disagrees with :data:`_SIGNATURES` (empty
    when they agree)."""
    theirs = _parse_signatures(table)
    for name, ours in _SIGNATURES.items():
        if theirs.get(name) != ours:
            return (
                f"the native library's argument table differs from headlab's for {name} "
                f"(library {theirs.get(name)!r}, headlab {ours!r}); kernels refused"
            )
    return ""


def _load() -> tuple[Any, str]:
    if os.environ.get("HEADLAB_NATIVE", "1") == "0":
        return None, _CHOSEN[0]
    if sys.platform not in ("linux", "darwin"):
        return None, f"native kernels are built on Linux and macOS only, not {sys.platform}"
    forced = os.environ.get("HEADLAB_NATIVE") == "1"
    if not forced and platform.machine().lower() not in ("x86_64", "amd64"):
        return None, (
            f"{_CHOSEN[1]} ({platform.machine()}): the kernels are measured on x86 only "
            "(HEADLAB_NATIVE=1 builds them)"
        )
    try:
        compiler = _compiler()
    except ValueError as err:  # shlex: an unclosed quote
        return None, f"CC cannot be split into words ({err}): {os.environ.get('CC')!r}"
    if not compiler:
        return None, "no C compiler found ($CC, cc or gcc)"
    try:
        try:
            path = _build(compiler, FLAGS + OPENMP)
        except _CompilerHung:
            raise
        except (OSError, subprocess.SubprocessError):
            path = _build(compiler, FLAGS)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"building the native kernels failed: {err}"
    try:
        lib.headlab_signatures.restype = ctypes.c_char_p
        table = lib.headlab_signatures().decode()
    except AttributeError:
        return None, "the native library exports no argument table (headlab_signatures)"
    mismatch = _signature_mismatch(table)
    if mismatch:
        return None, mismatch
    lib.headlab_openmp.restype = lib.headlab_vector_bits.restype = ctypes.c_int
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [_CTYPES[a] for a in args], None
    return lib, ""


def kernels() -> Any:
    """The loaded library (built on first call), or ``None``; see :func:`why_not`."""
    with _lock:
        if "lib" not in _state:
            _state["lib"], _state["why"] = _load()
    return _state["lib"]


def why_not() -> str:
    """Why :func:`kernels` is ``None`` (empty when the kernels are in use)."""
    kernels()
    return str(_state["why"])


def fused_scores() -> bool:
    """Whether :func:`attend_rows` should compute the scores: only where the kernels have their
    AVX-512 paths. Built without them (``-mno-avx512f`` here), its products lose to MKL's: 7.7
    ms against 3.3 ms for one 8 x 12 x 64 x 512 block's scores and softmax. The portable
    softmax and word argmax still beat torch's ops."""
    lib = kernels()
    return lib is not None and lib.headlab_vector_bits() >= 512


def l2_bytes() -> int:
    """The L2 cache of one core in bytes (Linux sysfs), or 1 MiB where it cannot be read."""
    if "l2" not in _state:
        size = 1 << 20
        try:
            for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
                if (index / "level").read_text().strip() == "2":
                    text = (index / "size").read_text().strip().upper()
                    unit = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
                    size = int(text.rstrip("KM")) * unit
                    break
        except (OSError, ValueError):
            pass
        _state["l2"] = size
    return int(_state["l2"])


def by_choice() -> bool:
    """Whether the kernels are off by design (``HEADLAB_NATIVE=0``, or a CPU they are not
    measured on), not for want of a working compiler."""
    return kernels() is None and why_not().startswith(_CHOSEN)


def reset() -> None:
    """Forget the loaded library, so that the next :func:`kernels` looks again (tests)."""
    with _lock:
        _state.clear()


_pool: ThreadPoolExecutor | None = None


def parallel(fn: Callable[[int, int], None], n: int, *, min_share: int = 1) -> None:
    """``fn(first, last)`` over ``range(n)``: in one call when the kernels split their loops
    with OpenMP, else over slices, one per torch thread (at least ``min_share`` items each), the
    last on the calling thread (ctypes calls release the GIL, so the slices run at once)."""
    global _pool
    if kernels().headlab_openmp():  # the kernel splits its loop itself
        fn(0, n)
        return
    parts = max(1, min(torch.get_num_threads(), n // max(1, min_share)))
    if parts == 1:
        fn(0, n)
        return
    if _pool is None or _pool._max_workers < parts - 1:
        _pool = ThreadPoolExecutor(max_workers=parts - 1, thread_name_prefix="headlab-rows")
    bounds = [n * k // parts for k in range(parts + 1)]
    futures = [_pool.submit(fn, bounds[k], bounds[k + 1]) for k in range(parts - 1)]
    fn(bounds[-2], bounds[-1])
    for f in futures:
        f.result()
