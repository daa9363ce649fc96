"""Model names from the local Hugging Face cache, offline.

The cache is laid out by huggingface_hub itself: a child process downloads a tiny model with
``hf_hub_download`` from a stand-in for the Hub's file API on the loopback address (the only
network these tests touch), then headlab resolves the name with the network off.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from tests.models.tiny import build

from headlab.errors import ModelLoadError
from headlab.models import encode, load
from headlab.models.hub import looks_like_repo_id

REPO = "tiny-org/tiny-bert"


def _server(repo: str, revisions: dict[str, tuple[str, Path]]) -> ThreadingHTTPServer:
    """Serve ``/{repo}/resolve/{revision}/{file}`` (HEAD and GET) for each revision's folder."""
    tables = {
        rev: (commit, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
        for rev, (commit, folder) in revisions.items()
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self, body: bool) -> None:
            prefix = f"/{repo}/resolve/"
            rev, _, name = self.path[len(prefix) :].partition("/")
            if not self.path.startswith(prefix) or rev not in tables:
                self.send_response(404)
                self.send_header("X-Error-Code", "RevisionNotFound")
                self.end_headers()
                return
            commit, files = tables[rev]
            data = files.get(name)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", '"' + hashlib.sha1(data).hexdigest() + '"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self) -> None:
            self._answer(False)

        def do_GET(self) -> None:
            self._answer(True)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _download(hf_home: Path, port: int, repo: str, revision: str, files: list[str]) -> None:
    """huggingface_hub's own download into ``hf_home`` (in a child: the tests run offline)."""
    code = (
        "import sys\nfrom huggingface_hub import hf_hub_download\n"
        "for f in sys.argv[3:]:\n    hf_hub_download(sys.argv[1], f, revision=sys.argv[2])\n"
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_HOME=str(hf_home),
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    env.pop("HF_HUB_CACHE", None)
    subprocess.run(
        [sys.executable, "-c", code, repo, revision, *files], env=env, check=True, timeout=120
    )


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """A Hub cache holding ``REPO`` at ``main`` (seed 0) and at tag ``v2`` (seed 1)."""
    root = tmp_path_factory.mktemp("hub")
    main = build("bert", root / "main", seed=0)
    v2 = build("bert", root / "v2", seed=1)
    server = _server(REPO, {"main": ("a" * 40, main), "v2": ("b" * 40, v2)})
    try:
        home = root / "hf-home"
        files = sorted(p.name for p in main.iterdir() if p.is_file())
        _download(home, server.server_port, REPO, "main", files)
        _download(home, server.server_port, REPO, "v2", files)
    finally:
        server.shutdown()
    yield home, main, v2


def _hidden(
    lm_path: object, text: str = "The chef prepared the fish.", **kw: object
) -> torch.Tensor:
    lm = load(lm_path, **kw)  # type: ignore[arg-type]
    with torch.no_grad():
        return lm.model(**encode(lm, [text])).last_hidden_state


def test_a_cached_name_loads_the_model_the_cache_holds(
    hub_cache: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, main, v2 = hub_cache
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert (home / "hub" / "models--tiny-org--tiny-bert" / "refs" / "v2").is_file()
    lm = load(REPO)
    assert lm.name == REPO
    assert lm.path.is_relative_to(home)  # the snapshot in the cache, not a copy
    assert torch.equal(_hidden(REPO), _hidden(main))
    assert torch.equal(_hidden(REPO, revision="v2"), _hidden(v2))
    assert not torch.equal(_hidden(main), _hidden(v2))  # the revisions really differ


def test_hf_hub_cache_overrides_hf_home(
    hub_cache: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home, main, _ = hub_cache
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # empty
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    assert torch.equal(_hidden(REPO), _hidden(main))


def test_a_name_not_in_the_cache_says_where_it_looked_and_how_to_fill_it(
    hub_cache: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home, _, _ = hub_cache
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    with pytest.raises(ModelLoadError) as err:
        load("someone/not-cached")
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "hub") in message and "hf download someone/not-cached" in message
    monkeypatch.setenv("HF_HOME", str(home))
    with pytest.raises(ModelLoadError, match=r"revision 'v9'.*--revision v9"):
        load(REPO, revision="v9")


def test_a_folder_wins_and_revision_is_refused_for_folders(
    hub_cache: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, main, _ = hub_cache
    assert torch.equal(_hidden(str(main)), _hidden(main))
    with pytest.raises(ModelLoadError, match="applies to cached model names"):
        load(main, revision="v2")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("gpt2", True),
        ("Qwen/Qwen2.5-0.5B", True),
        ("meta-llama/Llama-3.1-8B", True),
        ("a/b/c", False),
        ("../x", False),
        ("", False),
        ("/abs/path", False),
        ("name with space", False),
    ],
)
def test_repo_id_shape(name: str, expected: bool) -> None:
    assert looks_like_repo_id(name) is expected


def test_the_commands_take_a_cached_name_and_its_revision(
    hub_cache: tuple[Path, Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from headlab.cli import main

    home, main_folder, v2 = hub_cache
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    sentence = ["The chef prepared the fish.", "--word", "prepared", "--json"]

    def heads(*model: str) -> dict:
        assert main(["heads", *sentence, "--device", "cpu", *model]) == 0
        return json.loads(capsys.readouterr().out)

    by_name, by_tag = heads("--model", REPO), heads("--model", REPO, "--revision", "v2")
    assert by_name["heads"] == heads("--model", str(main_folder))["heads"]
    assert by_tag["heads"] == heads("--model", str(v2))["heads"]
    assert main(["heads", *sentence, "--model", "nobody/nothing"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hf download nobody/nothing" in err
