"""Write results so that nothing is ever half-written, lost, or left behind.

A result folder is written into a hidden sibling, ``.DIR.tmp-PID-XXXX``, and renamed into place.
An existing ``DIR`` is replaced by swapping the two names in one step (Linux ``renameat2`` with
``RENAME_EXCHANGE``); where that is unavailable, ``DIR`` is renamed to ``.DIR.old-PID`` and the
new folder to ``DIR``. A reader sees the old result or the new one, whole.

A run killed with ``kill -9`` leaves its hidden siblings behind; each carries the writer's process
id, and the next run on the same ``DIR`` removes those of dead processes. If a kill fell between
the two renames of the fallback (``DIR`` absent, ``.DIR.old-PID`` present), the next run first
renames the old copy back to ``DIR``. So ``DIR`` is never lost.

Every folder written here holds a marker file, ``.headlab-output``. ``overwrite`` replaces only
folders with that marker, an empty folder, or an output of an earlier version (a report with
``.headlab-report``, a pruned or trained model folder with its ``pruning.json`` or
``RECIPE.json``): any other folder is refused, even with ``--overwrite``, so a wrong ``--out``
cannot delete a user's files.

The output location is checked (:func:`check_output` for a folder, :func:`check_files` for a
command's output files) before any work, and write errors (a read-only or full disk) become
one-line :class:`~headlab.errors.OutputError` messages.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from headlab.errors import HeadlabError, InputError, OutputError, OutputExistsError

#: the marker file in every folder headlab writes; its JSON names the kind of output
MARKER = ".headlab-output"
#: markers written by earlier versions, with the kind they stand for
LEGACY_MARKERS = {".headlab-report": "report"}
#: temporary folders of earlier versions (no process id) are removed once this old (seconds)
LEGACY_TMP_AGE_S = 3600.0

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def output_kind(path: str | Path) -> str | None:
    """The kind of headlab output in folder ``path`` (``"report"``, ``"pruned-model"``...), or
    ``None`` when it holds no headlab marker."""
    path = Path(path)
    marker = path / MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            kind = None
        return str(kind) if kind else "output"
    for name, kind in LEGACY_MARKERS.items():
        if (path / name).is_file():
            return kind
    return _legacy_kind(path)


def _legacy_kind(path: Path) -> str | None:
    """Model folders of earlier versions, which wrote no marker: ``headlab prune``'s (a
    ``pruning.json`` beside a config with ``headlab_pruned``) and ``headlab train``'s."""
    try:
        if (path / "pruning.json").is_file():
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
            return "pruned-model" if "headlab_pruned" in config else None
        if (path / "RECIPE.json").is_file():
            recipe = json.loads((path / "RECIPE.json").read_text(encoding="utf-8"))
            return "trained-model" if recipe.get("trained_by") == "headlab train" else None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return None


def check_output(
    path: str | Path, *, overwrite: bool = False, kind: str = "output", replace_kind: bool = False
) -> Path:
    """Check, before any work, that the folder ``path`` can be written; tidy earlier runs' leftovers.

    ``overwrite``: replace an existing folder that headlab wrote (or an empty one).
    ``replace_kind``: replace an existing output of the same ``kind`` without ``overwrite``.

    Raises:
        OutputExistsError: ``path`` exists and may not be replaced (see the module docstring).
        OutputError: the folder cannot be created there (read-only, missing permission, full).
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise OutputError(f"cannot write to {path}: expected a folder name, got {str(path)!r}")
    tidy(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise OutputExistsError(f"{path} exists and is not a folder (expected a folder name)")
        found = output_kind(path)
        if found is None and any(path.iterdir()):
            raise OutputExistsError(
                f"{path} already exists and was not written by headlab (no {MARKER} file); "
                "choose another folder: --overwrite replaces only headlab's own outputs"
            )
        if not overwrite and not (replace_kind and found == kind):
            raise OutputExistsError(
                f"{path} already exists (choose another folder, or pass --overwrite)"
            )
    _probe(path)
    return path


def check_writable(path: str | Path) -> None:
    """Check, before any work, that a file can be written at ``path`` (a hidden folder is made
    and removed beside it: a read-only file system or a folder without permission fails here,
    not after minutes of computing).

    Raises:
        OutputError: one line naming ``path`` and why.
    """
    _probe(Path(path))


def check_files(
    outputs: Iterable[tuple[str, str | Path | None, str | None]], *, make_folders: bool = False
) -> None:
    """Check each output file ``(flag, path, suffix)`` given, before any work: its suffix
    (``None``: any), not a folder, in a folder that exists (``make_folders``: or can be made
    where the nearest existing one is) and can be written (:func:`check_writable`). The one
    check of every command's output files.

    Raises:
        InputError: one line naming the flag and the path.
    """
    for flag, value, suffix in outputs:
        if value is None:
            continue
        where = Path(value)
        if suffix is not None and where.suffix.lower() != suffix:
            raise InputError(f"{flag} {value}: expected a {suffix} file")
        what = f"a {suffix} file" if suffix is not None else "a file"
        if where.is_dir():
            raise InputError(f"{flag} {value}: is a folder; expected {what}")
        if not make_folders and not where.parent.is_dir():
            raise InputError(f"{flag} {value}: folder {where.parent} does not exist")
        try:
            check_writable(where)
        except OutputError as exc:
            raise InputError(f"{flag} {value}: {exc}") from None


def _probe(path: Path) -> None:
    """Create and remove a hidden folder where ``path`` will be written."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a folder")
    try:
        probe = tempfile.mkdtemp(dir=parent, prefix=f".{path.name}.tmp-{os.getpid()}-")
        os.rmdir(probe)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def write_error(path: str | Path, exc: BaseException) -> OutputError:
    """A one-line error for a failed write of ``path`` (OSError, SafetensorError...)."""
    return OutputError(f"cannot write {path}: {_why(exc)}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    try:  # a killed child its parent has not reaped yet is dead too
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return True


def tidy(path: str | Path) -> None:
    """Recover ``path`` from an interrupted replacement and remove dead runs' hidden leftovers."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        return
    name = re.escape(path.name)
    ours = re.compile(rf"\.{name}\.(?:old-(\d+)|tmp-(\d+)-[A-Za-z0-9_]+)")
    legacy = re.compile(rf"\.{name}\.[a-z0-9_]{{8}}\.tmp")
    olds: list[Path] = []
    others: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        match = ours.fullmatch(entry.name)
        if match:
            pid = int(match.group(1) or match.group(2))
            if not _alive(pid):
                (olds if match.group(1) else others).append(Path(entry.path))
        elif legacy.fullmatch(entry.name):
            try:
                age = time.time() - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if age > LEGACY_TMP_AGE_S:
                others.append(Path(entry.path))
    for old in olds:
        if not path.exists() and not path.is_symlink():
            try:
                os.rename(old, path)  # a kill fell between the two renames: the old copy returns
                continue
            except OSError:
                pass
        others.append(old)
    for leftover in others:
        shutil.rmtree(leftover, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step; ``False`` where the system cannot."""
    if not sys.platform.startswith("linux") or os.environ.get("HEADLAB_RENAME_EXCHANGE") == "0":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes += [ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_folder(
    path: str | Path, *, overwrite: bool = False, kind: str = "output", replace_kind: bool = False
) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it becomes ``path``, with the marker.

    ``overwrite`` and ``replace_kind``: as in :func:`check_output`, which runs before the body
    and again before the rename.

    Raises:
        OutputExistsError: ``path`` may not be replaced.
        OutputError: the folder cannot be written (an OSError inside the body, or on rename).
    """
    path = Path(path)
    check_output(path, overwrite=overwrite, kind=kind, replace_kind=replace_kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-"))
    except OSError as exc:
        raise write_error(path, exc) from None
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes it private; the result should not be
    try:
        yield tmp
        marker = {"written_by": "headlab", "kind": kind}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        _fsync_folder(tmp)
        check_output(path, overwrite=overwrite, kind=kind, replace_kind=replace_kind)
        if path.is_dir() and not path.is_symlink():
            if _exchange(tmp, path):
                shutil.rmtree(tmp, ignore_errors=True)  # it holds the old result now
            else:
                old = path.with_name(f".{path.name}.old-{os.getpid()}")
                os.replace(path, old)
                os.replace(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_folder(path.parent)
    except HeadlabError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(path, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: read once, at import, while no other thread can create files under the briefly zero umask
_UMASK = _read_umask()


def _file_mode() -> int:
    """What ``open(path, "w")`` would give a new file: 0666 less the process's umask."""
    return 0o666 & ~_UMASK


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same folder, flushed to disk and
    renamed into place: a reader sees the old file or the new one, never half of either. The
    one atomic file writer of headlab."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600; a written file follows the umask
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a folder gone read-only: one line, nothing half-written
        Path(tmp).unlink(missing_ok=True)
        raise write_error(path, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
