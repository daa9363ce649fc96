"""Model names resolved from the local Hugging Face cache, offline.

``--model gpt2`` or ``--model Qwen/Qwen2.5-0.5B`` finds the snapshot that ``hf download`` (or
any transformers program on a machine with network) left in the cache, exactly where
transformers itself would look with ``local_files_only=True``: ``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``. Nothing is ever downloaded. A path to an
existing folder always wins over a cached name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from headlab.errors import ModelLoadError

#: what a Hub repository id looks like: ``name`` or ``owner/name`` (letters, digits, ``-_.``)
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def looks_like_repo_id(name: str) -> bool:
    """Whether ``name`` could be a Hub repository id (``gpt2``, ``Qwen/Qwen2.5-0.5B``)."""
    return bool(_REPO_ID.match(name)) and ".." not in name


def cache_dir() -> Path:
    """The Hub cache that transformers reads (honours ``HF_HUB_CACHE`` and ``HF_HOME`` as set
    now, not only when huggingface_hub was first imported)."""

    explicit = os.environ.get("HF_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def resolve_cached(name: str, *, revision: str | None = None) -> Path:
    """The cached snapshot folder of Hub model ``name`` at ``revision`` (default ``main``).

    Raises:
        ModelLoadError: ``name`` is not a repository id, or it (or that revision) is not in the
            cache; the message names the cache folder searched and how to fill it.
    """
    if not looks_like_repo_id(name):
        raise ModelLoadError(
            f"--model {name!r} is neither a folder nor a Hugging Face model name (owner/name)"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir()
    try:
        folder = snapshot_download(name, revision=revision, cache_dir=cache, local_files_only=True)
    except LocalEntryNotFoundError:
        at = f" at revision {revision!r}" if revision else ""
        raise ModelLoadError(
            f"model {name!r}{at} is not a folder and not in the Hugging Face cache {cache}; "
            f"on a machine with network run `hf download {name}"
            f"{f' --revision {revision}' if revision else ''}` (set HF_HOME to use another cache)"
        ) from None
    except Exception as exc:  # a malformed cache entry, an invalid revision name
        raise ModelLoadError(
            f"model {name!r}: cannot read it from the Hugging Face cache {cache} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return Path(str(folder))
