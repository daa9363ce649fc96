"""The one place headlab keeps what it computes once: built native kernels (``native/``),
converted GGUF models (``gguf/``) and measured roles for the explorer (``roles/``).

``$HEADLAB_CACHE``, else ``$XDG_CACHE_HOME/headlab``, else ``~/.cache/headlab``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder (not created here)."""
    explicit = os.environ.get("HEADLAB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "headlab"


def cached_roles_path(model: str) -> Path:
    """Where a roles run of the model named ``model`` is kept for the explorer (and read by
    ``headlab circuit`` as evidence): ``roles/<model>.json``, a ``/`` of a hub name as ``--``."""
    return cache_root() / "roles" / f"{model.replace('/', '--')}.json"
