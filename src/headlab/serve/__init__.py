"""``headlab serve``: the live explorer, a local web app over the library.

:mod:`headlab.serve.app` answers the page and the JSON API as plain functions of a request;
:mod:`headlab.serve.http` puts them on a socket with the standard library's
``ThreadingHTTPServer``. No web framework: the explorer is a tool for one person on their own
machine, every request that touches a model runs one at a time anyway (the model's hooks are
shared, :mod:`headlab.explore.shelf`), and the standard library needs no install.

Example:
    >>> from headlab.serve import Explorer, Shelf, start_server
    >>> server = start_server(Explorer(Shelf()), port=0)  # a free port, in a thread
    >>> server.url                                        # doctest: +SKIP
    'http://127.0.0.1:40123/'
    >>> server.stop()
"""

from headlab.explore.roles import RoleSources
from headlab.explore.shelf import Shelf
from headlab.serve.app import Explorer, Limits
from headlab.serve.http import PortInUseError, RunningServer, make_server, start_server

__all__ = [
    "Explorer",
    "Limits",
    "PortInUseError",
    "RoleSources",
    "RunningServer",
    "Shelf",
    "make_server",
    "start_server",
]
