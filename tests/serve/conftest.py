"""Fixtures of the explorer's tests: a server on a free localhost port, and Debian's chromium
driven by Playwright (never `playwright install`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest


class Client:
    """Plain HTTP calls to a running explorer: ``(status, decoded JSON)``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def call(
        self, path: str, body: Any = None, *, raw: bytes | None = None, headers=None, method=None
    ):
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json", **(headers or {})},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The explorer (MiniLM by default) serving in a thread on a free port; stopped after."""
    from headlab.serve import Explorer, RoleSources, Shelf, start_server

    running = start_server(Explorer(Shelf(), RoleSources()), port=0)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def client(server: Any) -> Client:
    return Client(server.url)


def watch(page: Any) -> Any:
    """Record the page's console errors and every request it makes."""
    page.errors = []
    page.requests = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("request", lambda r: page.requests.append(r.url))
    return page
