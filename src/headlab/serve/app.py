"""The explorer's routes: the page and its JSON API, as plain functions of a request.

=================== ======= ===================================================================
path                method  answer
=================== ======= ===================================================================
``/``               GET     the page (:mod:`headlab.page.explorer`)
``/api/models``     GET     the picker's models, the input limits, the opening sentence
``/api/sentence``   POST    ``{model, text, word?}``: every head's pattern (``headlab.sentence/1``)
``/api/heads``      GET/POST the table of ``headlab heads TEXT --json``, same keys and values
                            (``text``, ``model``, ``word``, ``layer``/``head`` repeatable, ``top``)
``/api/ablate``     POST    ``{model, text, ablate: [[layer, head]...], other?, k?, mode?, seed?}``
                            (mode ``zero``, ``mean`` or ``resample``): next-token
                            prediction or embedding similarity with and without those heads
``/api/roles``      GET     ``?model=``: the model's roles run, and where it comes from
=================== ======= ===================================================================

Errors are JSON ``{"error": "..."}``: 400 for input that cannot be used, 404 for an unknown
path or model, 413 for a text over the limits (characters, or tokens of the chosen model).
Every use of a model holds the shelf's lock: one sentence at a time runs through a model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from headlab.errors import HeadlabError, InputError, ModelLoadError, TooLongError
from headlab.explore.ablation import ablation_effect, reference_means, resample_source, token_count
from headlab.explore.roles import RoleSources
from headlab.explore.sentence import capture_sentence
from headlab.explore.shelf import Shelf
from headlab.explore.table import LESSON_SENTENCE, heads_table
from headlab.models.names import DEFAULT
from headlab.page.explorer import page
from headlab.page.styles import role_styles

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one request may ask for."""

    characters: int = 1000  # of a text
    tokens: int = 128  # of a text, in the chosen model's tokens
    body_bytes: int = 64 * 1024  # of a request's JSON body
    ablated: int = 512  # heads switched off at once
    #: a client silent this long while sending a request (or between requests of one
    #: connection) loses it: a stalled client cannot hold a server thread
    seconds: float = 10.0


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


class ApiError(Exception):
    """A request the API refuses, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_response(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data, ensure_ascii=False, allow_nan=False).encode("utf-8"))


class Explorer:
    """The app: a shelf of models, their roles runs, the limits, and the routes.

    Args:
        shelf: the models (:class:`~headlab.explore.shelf.Shelf`).
        roles: the roles runs (:class:`~headlab.explore.roles.RoleSources`).
        limits: what one request may ask for.
        sentence: the sentence the page opens on.
    """

    def __init__(
        self,
        shelf: Shelf,
        roles: RoleSources | None = None,
        *,
        limits: Limits = Limits(),  # frozen: one shared default is safe
        sentence: str = LESSON_SENTENCE,
    ) -> None:
        self.shelf = shelf
        self.roles = roles or RoleSources()
        self.limits = limits
        self.sentence = sentence
        self._page: tuple[str, str] | None = None
        self._mean_cache: dict[int, Any] = {}  # id(model) -> its heads' mean outputs

    # ------------------------------------------------------------------ dispatch
    def handle(self, method: str, target: str, body: bytes = b"") -> Response:
        """Answer one request (``target``: the path with its query string)."""
        url = urlsplit(target)
        query = parse_qs(url.query)
        routes = {
            ("GET", "/"): lambda: self.page(),
            ("GET", "/api/models"): lambda: self.models(),
            ("POST", "/api/sentence"): lambda: self.sentence_json(self._body(body)),
            ("GET", "/api/heads"): lambda: self.heads(_from_query(query)),
            ("POST", "/api/heads"): lambda: self.heads(self._body(body)),
            ("POST", "/api/ablate"): lambda: self.ablate(self._body(body)),
            ("GET", "/api/roles"): lambda: self.roles_json(_from_query(query)),
        }
        route = routes.get((method, url.path))
        try:
            if route is None:
                if any(path == url.path for _, path in routes):
                    raise ApiError(405, f"{method} is not answered at {url.path}")
                raise ApiError(404, f"no such path: {url.path}")
            return route()
        except ApiError as exc:
            return json_response({"error": str(exc)}, exc.status)
        except TooLongError as exc:
            return json_response({"error": str(exc)}, 413)
        except ModelLoadError as exc:
            return json_response({"error": str(exc)}, 404)
        except HeadlabError as exc:
            return json_response({"error": str(exc)}, 400)

    def page(self) -> Response:
        if self._page is None:
            self._page = page()
        html, policy = self._page
        headers = {"Content-Security-Policy": policy, "Cache-Control": "no-store"}
        return Response(200, html.encode("utf-8"), "text/html; charset=utf-8", headers)

    # ------------------------------------------------------------------ input
    def _body(self, body: bytes) -> dict[str, Any]:
        if len(body) > self.limits.body_bytes:
            raise ApiError(
                413, f"the request has {len(body)} bytes; the limit is {self.limits.body_bytes}"
            )
        try:
            data = json.loads(body.decode("utf-8") or "{}")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"the request's body is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request's body must be a JSON object")
        return data

    def _text(self, data: Mapping[str, Any], key: str = "text") -> str:
        text = data.get(key)
        if not isinstance(text, str) or not text.strip():
            raise ApiError(400, f"{key!r} must be a non-empty string")
        if len(text) > self.limits.characters:
            raise ApiError(
                413,
                f"the {key} has {len(text)} characters; the explorer takes at most "
                f"{self.limits.characters}",
            )
        return text

    def _model(self, data: Mapping[str, Any]) -> Any:
        name = data.get("model")
        if name is not None and not isinstance(name, str):
            raise ApiError(400, "'model' must be a string")
        try:
            key = self.shelf.key(name)
        except InputError as exc:
            raise ApiError(404, str(exc)) from None
        return self.shelf.get(key)

    def _fits(self, lm: Any, text: str, key: str = "text") -> None:
        n = len(lm.tokenizer(text)["input_ids"])
        if n > self.limits.tokens:
            raise ApiError(
                413,
                f"the {key} has {n} tokens for {lm.name}; the explorer takes at most "
                f"{self.limits.tokens}",
            )

    # ------------------------------------------------------------------ routes
    def models(self) -> Response:
        limits = {"characters": self.limits.characters, "tokens": self.limits.tokens}
        return json_response(
            {"models": self.shelf.describe(), "limits": limits, "sentence": self.sentence}
        )

    def sentence_json(self, data: dict[str, Any]) -> Response:
        text = self._text(data)
        word = _optional_str(data, "word")
        with self.shelf.lock:
            lm = self._model(data)
            self._fits(lm, text)
            heads = capture_sentence(lm, text, word=word)
            answer = heads.to_json()
        return json_response({**answer, "key": self.shelf.key(data.get("model"))})

    def heads(self, data: dict[str, Any]) -> Response:
        text = self._text(data)
        layers, heads = _ints(data, "layers"), _ints(data, "heads")
        top = data.get("top", 3)
        if not isinstance(top, int) or isinstance(top, bool):
            raise ApiError(400, "'top' must be an integer")
        with self.shelf.lock:
            lm = self._model(data)
            self._fits(lm, text)
            table = heads_table(
                lm, text, word=_optional_str(data, "word"), layers=layers, heads=heads, top=top
            )
        return json_response(table)

    def ablate(self, data: dict[str, Any]) -> Response:
        text = self._text(data)
        other = None if data.get("other") in (None, "") else self._text(data, "other")
        pairs = data.get("ablate") or []
        if not isinstance(pairs, list) or len(pairs) > self.limits.ablated:
            raise ApiError(
                400, f"'ablate' must be a list of at most {self.limits.ablated} [layer, head] pairs"
            )
        ablate: dict[int, list[int]] = {}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2 and all(_is_int(x) for x in pair)):
                raise ApiError(400, f"each head to switch off is [layer, head], got {pair!r}")
            ablate.setdefault(pair[0], []).append(pair[1])
        k = data.get("k", 5)
        if not _is_int(k) or not 1 <= k <= 50:
            raise ApiError(400, "'k' must be an integer from 1 to 50")
        mode = data.get("mode", "zero")
        if mode not in ("zero", "mean", "resample"):
            raise ApiError(400, f"'mode' must be zero, mean or resample, got {mode!r}")
        seed = data.get("seed", 0)
        if not _is_int(seed) or not 0 <= seed < 2**31:
            raise ApiError(400, "'seed' must be an integer from 0 to 2**31 - 1")
        with self.shelf.lock:
            lm = self._model(data)
            self._fits(lm, text)
            if other is not None:
                self._fits(lm, other, "other")
            means = self._means(lm) if mode == "mean" and ablate else None
            resample = None
            if mode == "resample" and ablate:
                texts = [text] if other is None else [text, other]
                resample = resample_source(lm, token_count(lm, *texts), seed=seed)
            effect = ablation_effect(
                lm, text, ablate, other=other, k=k, means=means, resample=resample
            )
        return json_response({**effect.to_json(), "mode": mode})

    def _means(self, lm: Any) -> Any:
        """Each head's mean output over reference text, once per model (mean ablation)."""

        if id(lm) not in self._mean_cache:
            self._mean_cache[id(lm)] = reference_means(lm)
        return self._mean_cache[id(lm)]

    def roles_json(self, data: dict[str, Any]) -> Response:
        with self.shelf.lock:
            lm = self._model(data)
        key = self.shelf.key(data.get("model"))
        command = None if key == DEFAULT else self.shelf.choices[key].source
        found = self.roles.for_model(lm.name, list(lm.layout.heads_per_layer), command)
        return json_response({**found, "role_style": role_styles(found["roles"])})


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _optional_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{key!r} must be a string")
    return value


def _ints(data: Mapping[str, Any], key: str) -> list[int] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(_is_int(x) for x in value):
        raise ApiError(400, f"{key!r} must be a list of integers")
    return value or None


def _from_query(query: dict[str, list[str]]) -> dict[str, Any]:
    """A query string as the JSON body it stands for: ``layer``/``head`` repeatable, as the
    command's flags (``?text=...&layer=2&head=0&head=5&top=3``)."""
    out: dict[str, Any] = {}
    for key in ("text", "model", "word"):
        if key in query:
            out[key] = query[key][-1]
    try:
        for flag, key in (("layer", "layers"), ("head", "heads")):
            if flag in query:
                out[key] = [int(x) for x in query[flag]]
        if "top" in query:
            out["top"] = int(query["top"][-1])
    except ValueError:
        raise ApiError(400, "layer, head and top must be integers") from None
    return out
