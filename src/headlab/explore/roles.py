"""The roles run the explorer shows beside a head: from a file given, or from the cache.

Roles are measured on gold data by ``headlab roles`` (20 s for MiniLM, minutes for a decoder),
never by the explorer itself. It shows, for each model, the first of:

1. a ``headlab roles --json`` file given with ``--roles FILE`` (repeatable: each file is matched
   to its model by the name it records);
2. the cached one, ``<cache>/roles/<model name>.json`` (``<cache>``: ``$HEADLAB_CACHE``, else
   ``$XDG_CACHE_HOME/headlab``, else ``~/.cache/headlab``), which every ``headlab roles`` run
   writes for its model (the latest wins);

and says which. A file measured on another head layout than the loaded model's is refused, in
the note the page shows.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from headlab.cache import cached_roles_path
from headlab.errors import DataFormatError, InputError
from headlab.page.panel import panel_head
from headlab.roles.results import read_roles_json


def read_roles(path: str | Path) -> dict[str, Any]:
    """The JSON of ``headlab roles --json`` in ``path`` (:func:`headlab.roles.results.read_roles_json`)."""
    return read_roles_json(path)


class RoleSources:
    """Roles runs by model name: the files given (read at once, so a bad one fails at start)
    and, for a model without one, its cached run."""

    def __init__(self, files: Iterable[str | Path] = ()) -> None:
        self.given: dict[str, tuple[Path, dict[str, Any]]] = {}
        for path in files:
            data = read_roles(path)
            if data["model"] in self.given:
                other = self.given[data["model"]][0]
                raise InputError(f"{path} and {other} are both roles runs of {data['model']!r}")
            self.given[data["model"]] = (Path(path), data)

    def check_known(self, names: Iterable[str]) -> None:
        """A one-line error for a given file whose model is none of ``names``."""
        known = set(names)
        for model, (path, _) in self.given.items():
            if model not in known:
                raise InputError(
                    f"{path} was measured on {model!r}, which the explorer does not offer "
                    f"(it offers {', '.join(sorted(known))}; give the model with --model)"
                )

    def for_model(
        self, name: str, heads_in_layer: list[int], command: str | None = None
    ) -> dict[str, Any]:
        """What the page shows for the model ``name``: ``source`` (the file, or ``None``),
        ``note`` (in words), ``roles`` (the run's role names, in its order) and ``heads``
        (the keys the report's panel reads too,
        :data:`headlab.page.panel.PANEL_KEYS`); ``command``: what ``--model`` takes to measure
        it (``None`` for the default model)."""
        if name in self.given:
            path, data = self.given[name]
            source = f"{path} (--roles)"
        else:
            path = cached_roles_path(name)
            if not path.is_file():
                return {
                    "model": name,
                    "source": None,
                    "note": f"No roles run for {name}: measure one with `headlab roles"
                    f"{'' if command is None else ' --model ' + command} --json > roles.json` "
                    f"and start with --roles roles.json, or save it as {path}.",
                    "heads": [],
                    "roles": [],
                }
            try:
                data = read_roles(path)
            except (InputError, DataFormatError) as exc:
                return {"model": name, "source": None, "note": str(exc), "heads": [], "roles": []}
            source = f"the cache, {path}"
        if list(data.get("heads_in_layer") or []) != list(heads_in_layer):
            return {
                "model": name,
                "source": None,
                "note": f"{path} has heads per layer {data.get('heads_in_layer')}, {name} has "
                f"{list(heads_in_layer)}: not shown",
                "heads": [],
                "roles": [],
            }
        heads = [panel_head(h) for h in data["heads"]]
        roles = list(data.get("role_counts") or {h["role"] for h in heads})
        return {
            "model": name,
            "source": source,
            "note": f"Roles from {source}.",
            "heads": heads,
            "roles": roles,
        }
