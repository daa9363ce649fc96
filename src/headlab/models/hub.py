"""Model names: the snapshot in the Hugging Face cache, downloaded when it is not there.

``--model gpt2`` or ``--model Qwen/Qwen2.5-0.5B`` opens the snapshot in the cache where
transformers looks (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``). A name not cached yet is downloaded as transformers would,
through huggingface_hub (its endpoint ``HF_ENDPOINT``, ``HF_TOKEN`` for gated and private
models, its progress bars on stderr): the config, the safetensors weights and the tokenizer's
files, nothing else. A cached snapshot is used as it is, with no network call (``hf download``
refreshes it). With downloads off (``--offline``, ``HF_HUB_OFFLINE=1`` or
``TRANSFORMERS_OFFLINE=1``) a name not cached is a one-line error naming the cache searched.
A path to an existing folder always wins over a name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
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


#: what a download fetches: the config, safetensors weights and their index, tokenizer files
FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline_by_environment() -> bool:
    """Whether ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` turn downloads off, as set now."""
    return any(
        os.environ.get(var, "").strip().upper() in _TRUE
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def resolve(
    name: str,
    *,
    revision: str | None = None,
    offline: bool = False,
    notify: Callable[[str], None] | None = None,
) -> Path:
    """The snapshot folder of Hub model ``name`` at ``revision`` (default ``main``): from the
    cache, else downloaded (``notify`` is told in one line first) unless ``offline`` or the
    environment turns downloads off.

    Raises:
        ModelLoadError: not a repository id; with downloads off, not in the cache; else a name
            the Hub does not have, a gated or private one without access, a revision it does
            not have, or a Hub that cannot be reached (each in one line).
    """
    if offline or offline_by_environment():
        return resolve_cached(name, revision=revision, offline=True)
    try:
        return resolve_cached(name, revision=revision)
    except ModelLoadError:
        pass
    return _download(name, revision, notify)


def _download(name: str, revision: str | None, notify: Callable[[str], None] | None) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    cache, endpoint = cache_dir(), constants.ENDPOINT
    at = f" at revision {revision!r}" if revision else ""
    if notify is not None:
        notify(f"downloading {name}{at} from {endpoint} into {cache}")
    quiet = are_progress_bars_disabled()
    if notify is not None:  # the person who asked sees the bars, whatever transformers set
        enable_progress_bars()
    try:
        folder = snapshot_download(
            name, revision=revision, cache_dir=cache, allow_patterns=list(FILES)
        )
    except GatedRepoError:
        raise ModelLoadError(
            f"model {name!r} is gated: accept its conditions on its Hub page and set HF_TOKEN "
            "to a token of that account"
        ) from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"model {name!r} is not a folder and not on the Hugging Face Hub ({endpoint}); "
            "a private model needs HF_TOKEN"
        ) from None
    except RevisionNotFoundError:
        raise ModelLoadError(
            f"model {name!r} has no revision {revision!r} on the Hugging Face Hub ({endpoint})"
        ) from None
    except LocalEntryNotFoundError:
        raise ModelLoadError(
            f"model {name!r}{at} is not in the Hugging Face cache {cache} and the Hub "
            f"({endpoint}) cannot be reached; check the network, or run `hf download {name}` "
            "where there is one"
        ) from None
    except HfHubHTTPError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"downloading model {name!r} failed: {first}") from None
    except OSError as exc:  # a full disk, a cache that cannot be written
        raise ModelLoadError(
            f"downloading model {name!r} into {cache} failed: {exc.strerror or exc}"
        ) from None
    finally:
        if quiet and notify is not None:
            disable_progress_bars()
    return Path(str(folder))


def resolve_cached(name: str, *, revision: str | None = None, offline: bool = False) -> Path:
    """The cached snapshot folder of Hub model ``name`` at ``revision`` (default ``main``).

    Raises:
        ModelLoadError: ``name`` is not a repository id, or it (or that revision) is not in the
            cache; the message names the cache folder searched and how to fill it (``offline``:
            that downloads are off).
    """
    if not looks_like_repo_id(name):
        raise ModelLoadError(
            f"--model {name!r} is neither a folder nor a Hugging Face model name (owner/name)"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = cache_dir()
    try:
        folder = snapshot_download(
            name,
            revision=revision,
            cache_dir=cache,
            local_files_only=True,
            allow_patterns=list(FILES),  # a snapshot headlab downloaded holds no more
        )
    except LocalEntryNotFoundError:
        at = f" at revision {revision!r}" if revision else ""
        off = " and downloads are off (--offline, HF_HUB_OFFLINE)" if offline else ""
        raise ModelLoadError(
            f"model {name!r}{at} is not a folder and not in the Hugging Face cache {cache}{off}; "
            f"on a machine with network run `hf download {name}"
            f"{f' --revision {revision}' if revision else ''}` (set HF_HOME to use another cache)"
        ) from None
    except Exception as exc:  # a malformed cache entry, an invalid revision name
        raise ModelLoadError(
            f"model {name!r}: cannot read it from the Hugging Face cache {cache} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    return Path(str(folder))
