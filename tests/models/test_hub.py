"""Model names: the Hugging Face cache, and downloads from the Hub.

The cache is laid out by huggingface_hub itself: a child process downloads a tiny model from a
stand-in for the Hub on the loopback address (the only network these tests touch), with
``hf_hub_download``, or with headlab's own command where the download is what is tested.
"""

from __future__ import annotations

import hashlib
import json
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


def _server(
    repo: str, revisions: dict[str, tuple[str, Path]], *, gated: str = "", log: list | None = None
) -> ThreadingHTTPServer:
    """A stand-in for the Hub on the loopback address, serving ``repo``'s revisions (each a
    commit and a folder): the model info (``/api/models/{repo}/revision/{rev}``), the file tree
    (``/api/models/{repo}/tree/{commit}``) and ``/{repo}/resolve/{rev}/{file}`` (HEAD and GET);
    ``gated`` is a repository that answers as gated. Every request path goes to ``log``."""
    tables = {
        rev: (commit, {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()})
        for rev, (commit, folder) in revisions.items()
    }
    by_commit = {commit: files for commit, files in tables.values()}
    seen = log if log is not None else []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, value: object, code: str = "") -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _api(self) -> None:
            path = self.path.split("?")[0]
            if path.startswith(f"/api/models/{gated}/") and gated:
                self._json(401, {"error": "Access to this model is restricted"}, "GatedRepo")
                return
            if not path.startswith(f"/api/models/{repo}/"):
                self._json(404, {"error": "Repository not found"}, "RepoNotFound")
                return
            kind, _, rev = path[len(f"/api/models/{repo}/") :].partition("/")
            if kind == "revision" and rev in tables:
                commit, files = tables[rev]
                siblings = [{"rfilename": name} for name in sorted(files)]
                self._json(200, {"id": repo, "sha": commit, "siblings": siblings})
            elif kind == "tree" and rev in by_commit:
                entries = [
                    {"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                    for name, data in sorted(by_commit[rev].items())
                ]
                self._json(200, entries)
            else:
                self._json(404, {"error": f"Invalid rev id: {rev}"}, "RevisionNotFound")

        def _answer(self, body: bool) -> None:
            seen.append(self.path)
            if self.path.startswith("/api/"):
                self._api()
                return
            prefix = f"/{repo}/resolve/"
            rev, _, name = self.path[len(prefix) :].partition("/")
            if not self.path.startswith(prefix) or (rev not in tables and rev not in by_commit):
                self.send_response(404)
                self.send_header("X-Error-Code", "RevisionNotFound")
                self.end_headers()
                return
            if rev in tables:
                commit, files = tables[rev]
            else:
                commit, files = rev, by_commit[rev]
            data = files.get(name)
            if data is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", '"' + _oid(data) + '"')
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


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


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
    with pytest.raises(ModelLoadError, match="applies to Hugging Face model names"):
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


def _headlab(args: list[str], hf_home: Path, port: int, *, online: bool = True):
    """``headlab ARGS`` in a child whose Hub is the stand-in (``online``: downloads on)."""
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(hf_home))
    env.pop("HF_HUB_CACHE", None)
    if online:
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
    return subprocess.run(
        [sys.executable, "-m", "headlab", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_name_not_cached_is_downloaded_from_the_hub_unless_offline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.cli import main

    folder = build("bert", tmp_path / "model", seed=3)
    (folder / "pytorch_model.bin").write_bytes(b"not fetched: headlab reads safetensors")
    log: list[str] = []
    server = _server(REPO, {"main": ("c" * 40, folder)}, gated="gated-org/tiny", log=log)
    sentence = ["heads", "The chef prepared the fish.", "--word", "prepared", "--json"]
    sentence += ["--device", "cpu", "--model"]
    try:
        home = tmp_path / "hf-home"
        first = _headlab([*sentence, REPO], home, server.server_port)
        assert first.returncode == 0, first.stderr
        assert f"downloading {REPO} from http://127.0.0.1:" in first.stderr
        assert "Traceback" not in first.stderr
        assert main([*sentence, str(folder)]) == 0
        assert json.loads(first.stdout)["heads"] == json.loads(capsys.readouterr().out)["heads"]
        snapshot = home / "hub" / "models--tiny-org--tiny-bert" / "snapshots" / ("c" * 40)
        assert (snapshot / "config.json").is_file()
        assert not (snapshot / "pytorch_model.bin").exists()  # what headlab reads, no more

        def asked() -> int:  # the model's files and info (huggingface_hub asks for more)
            return sum(REPO in path for path in log)

        before = asked()  # cached now: no network call, the same answer
        again = _headlab([*sentence, REPO], home, server.server_port)
        assert again.returncode == 0 and again.stdout == first.stdout and asked() == before
        assert "downloading" not in again.stderr and "Fetching" not in again.stderr

        fresh = tmp_path / "empty-home"
        for offline, env in ((["--offline"], True), ([], False)):
            refused = _headlab([*sentence, REPO, *offline], fresh, server.server_port, online=env)
            assert refused.returncode == 1 and asked() == before
            (line,) = refused.stderr.strip().splitlines()
            assert "downloads are off" in line and f"hf download {REPO}" in line

        for name, says in (("gated-org/tiny", "is gated"), ("nobody/nothing", "not on the")):
            refused = _headlab([*sentence, name], fresh, server.server_port)
            assert refused.returncode == 1, refused.stderr
            said, line = refused.stderr.strip().splitlines()  # what it tried, and why not
            assert said.startswith(f"headlab: note: downloading {name}")
            assert says in line and name in line, line
        wrong = _headlab([*sentence, REPO, "--revision", "v7"], fresh, server.server_port)
        assert wrong.returncode == 1 and "has no revision 'v7'" in wrong.stderr
    finally:
        server.shutdown()
