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

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.explore.roles import RoleSources as RoleSources
    from headlab.explore.shelf import Shelf as Shelf
    from headlab.serve.app import Explorer as Explorer
    from headlab.serve.app import Limits as Limits
    from headlab.serve.http import PortInUseError as PortInUseError
    from headlab.serve.http import RunningServer as RunningServer
    from headlab.serve.http import make_server as make_server
    from headlab.serve.http import start_server as start_server

__getattr__, __dir__, __all__ = attach(__name__, __file__)
