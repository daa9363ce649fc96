"""The explorer on a socket: the standard library's ``ThreadingHTTPServer``, localhost by default.

Each request gets a thread, so the page stays answerable while a model loads; the models
themselves run one request at a time (the shelf's lock). A request body is read only up to the
app's limit, and a client that stops sending for the app's ``limits.seconds`` loses its request
(a JSON 408 when its body stalls) and its connection. Bound to a loopback address, the server
answers only requests whose ``Host`` is a loopback name: a web page elsewhere cannot reach it
through a DNS name of its own pointed at 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from headlab.errors import HeadlabError
from headlab.serve.app import Explorer, Response, json_response

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")


class PortInUseError(HeadlabError, OSError):
    """Another program already listens on the port asked for."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.app.limits.seconds)

    def _answer(self, method: str) -> None:
        app = self.server.app
        if self.server.loopback and not self._host_is_loopback():
            self._send(json_response({"error": "this server answers localhost only"}, 403))
            return
        body = b""
        if method == "POST":
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self._send(json_response({"error": "a bad Content-Length"}, 400))
                return
            if length > app.limits.body_bytes:
                self.close_connection = True  # the body is left unread
                message = f"the request has {length} bytes; the limit is {app.limits.body_bytes}"
                self._send(json_response({"error": message}, 413))
                return
            if "json" not in (self.headers.get("Content-Type") or ""):
                # a plain form post from another site cannot set this type without a preflight
                self._send(
                    json_response({"error": "send JSON (Content-Type: application/json)"}, 415)
                )
                return
            try:
                body = self.rfile.read(length)
            except TimeoutError:
                self.close_connection = True
                seconds = app.limits.seconds
                message = f"the request's body stalled: nothing came for {seconds:g} s"
                self._send(json_response({"error": message}, 408))
                return
            if len(body) < length:  # the client closed its side early
                self.close_connection = True
                return
        try:
            response = app.handle(method, self.path, body)
        except Exception:  # a bug: the page hears of it in one line, the log has the trace
            logger.exception("%s %s failed", method, self.path)
            response = json_response({"error": "internal error (see the server's log)"}, 500)
        self._send(response)

    def _host_is_loopback(self) -> bool:
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):  # [::1]:8000
            name = host[: host.find("]") + 1]
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return name in LOOPBACK_NAMES

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(response.body)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    # every other method gets the app's JSON 405 (or 404), not http.server's HTML 501
    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def do_PATCH(self) -> None:
        self._answer("PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        logger.info("%s %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: connections waiting to be accepted: a page opens several at once, and under load the
    #: standard library's 5 reset some of them
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: Explorer) -> None:
        self.app = app
        self.loopback = is_loopback(address[0])
        if ":" in address[0]:  # an IPv6 address
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client gone or stalled mid-answer: the log hears of it, stderr stays headlab's own
        logger.info("the connection from %s ended: %s", client_address, sys.exc_info()[1])


def make_server(app: Explorer, host: str = "127.0.0.1", port: int = 8000) -> _Server:
    """The server of ``app`` bound to ``host:port`` (``port=0``: a free one), not yet serving.

    Raises:
        PortInUseError: another program listens on ``port``.
        HeadlabError: the address cannot be bound (an unknown host, a port below 1024...).
    """
    if not 0 <= port <= 65535:
        raise HeadlabError(f"--port must be 0..65535, got {port}")
    try:
        return _Server((host, port), app)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"port {port} on {host} is taken (another program listens there): "
                "choose another with --port, or --port 0 for any free one"
            ) from None
        raise HeadlabError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


@dataclass
class RunningServer:
    """A server answering in a background thread; :meth:`stop` closes it."""

    server: _Server
    thread: threading.Thread

    @property
    def url(self) -> str:
        address = self.server.server_address
        host, port = str(address[0]), int(address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start_server(app: Explorer, host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """:func:`make_server`, serving in a daemon thread (for tests and notebooks)."""
    server = make_server(app, host, port)
    thread = threading.Thread(target=server.serve_forever, name="headlab-serve", daemon=True)
    thread.start()
    return RunningServer(server, thread)
