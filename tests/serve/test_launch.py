"""``headlab serve``'s start (:mod:`headlab.serve.launch`): bound before loading, and the line
that tells a person where the explorer answers."""

from __future__ import annotations

from headlab.serve.launch import Launch, ServeOptions


def test_the_line_says_the_model_the_address_and_who_can_reach_it() -> None:
    launch = Launch(ServeOptions(model="tiny-shakespeare", port=0))
    try:
        port = launch.server.server_address[1]
        assert launch.load() == f"tiny-shakespeare on http://127.0.0.1:{port}/ (Ctrl-C stops)"
    finally:
        launch.server.server_close()
    launch = Launch(ServeOptions(model="tiny-shakespeare", host="0.0.0.0", port=0))
    try:
        line = launch.load()
        assert line.endswith("/ (reachable from other machines) (Ctrl-C stops)"), line
        assert line.startswith("tiny-shakespeare on http://0.0.0.0:")
    finally:
        launch.server.server_close()
