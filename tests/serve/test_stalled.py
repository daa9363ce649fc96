"""A client that stops sending cannot hold the explorer: its request times out (a JSON 408 for
a stalled body), its connection closes, and everyone else is answered meanwhile."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

SECONDS = 2.0


@pytest.fixture(scope="module")
def quick() -> object:
    from headlab.serve import Explorer, RoleSources, Shelf, start_server
    from headlab.serve.app import Limits

    running = start_server(Explorer(Shelf(), RoleSources(), limits=Limits(seconds=SECONDS)), port=0)
    yield running
    running.stop()


def _stall(url: str, request: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(request)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_stalled_clients_time_out_while_200_others_are_answered(quick) -> None:
    body_stalls = [
        _stall(
            quick.url,
            b"POST /api/heads HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"text": "The chef',
        )
        for _ in range(10)
    ]
    header_stalls = [
        _stall(quick.url, b"POST /api/heads HTTP/1.1\r\nHost: 127.") for _ in range(10)
    ]
    started = time.monotonic()

    def get(_: int) -> int:
        with urllib.request.urlopen(quick.url + "api/models", timeout=30) as response:
            json.loads(response.read())
            return response.status

    with ThreadPoolExecutor(32) as pool:
        statuses = list(pool.map(get, range(200)))
    assert statuses == [200] * 200

    for sock in body_stalls:
        answer = _read_all(sock)  # ends: the server closes the connection
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), head
        assert "stalled" in json.loads(body)["error"]
    for sock in header_stalls:
        assert _read_all(sock) == b""  # closed without an answer: no request line ended
    waited = time.monotonic() - started
    assert SECONDS * 0.9 <= waited < SECONDS + 20
    for sock in body_stalls + header_stalls:
        sock.close()
