"""The explorer as ``headlab serve`` runs it: bound to its address before any model loads (a
taken port fails at once), its first model loaded before the first sentence comes, the roles
files checked against the models offered, and the line that says where it answers.

Example:
    >>> launch = Launch(ServeOptions(model="tiny-shakespeare", port=0))  # doctest: +SKIP
    >>> print(launch.load())                                             # doctest: +SKIP
    tiny-shakespeare on http://127.0.0.1:40123/ (Ctrl-C stops)
    >>> launch.server.serve_forever()                                    # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headlab.serve import Explorer, RoleSources, Shelf, make_server
from headlab.serve.http import is_loopback


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """What ``headlab serve`` is asked.

    Attributes:
        model: the model the page opens on (``None``: the default, MiniLM).
        host, port: where to listen (``port=0``: any free one).
        roles: ``headlab roles --json`` runs to show beside each head (one per model).
        threads: torch threads for the models.
    """

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    roles: tuple[str, ...] = ()
    threads: int = 1


class Launch:
    """The explorer's server of ``options``, bound but not yet serving, on ``device``.

    Raises:
        HeadlabError: a roles file that cannot be read, an address that cannot be bound
            (:func:`headlab.serve.http.make_server`).
    """

    def __init__(self, options: ServeOptions, *, device: Any = "cpu") -> None:
        import torch

        torch.set_num_threads(options.threads)
        self.roles = RoleSources(options.roles)  # a bad file fails now, not on the page
        self.shelf = Shelf(options.model, device=device)
        self.server = make_server(Explorer(self.shelf, self.roles), options.host, options.port)

    def load(self) -> str:
        """Load the first model (the first sentence should not wait for it), check the roles
        files against the models offered; the line saying where the explorer answers."""
        shelf = self.shelf
        lm = shelf.get()
        others = (c.label for c in shelf.choices.values() if c.key != shelf.default)
        self.roles.check_known([lm.name, *others])
        host, port = self.server.server_address[:2]
        host = str(host)
        note = "" if is_loopback(host) else " (reachable from other machines)"
        shown = f"[{host}]" if ":" in host else host
        return f"{lm.name} on http://{shown}:{port}/{note} (Ctrl-C stops)"
