"""The atlas of head cards (``headlab cards --html``) in a real browser (Debian's chromium
through Playwright): it opens offline with no console error, every card is reachable from the
grid and by its permalink, and each filter shows exactly the heads the JSON says match."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tests.models.tiny import build

from headlab.cli import main
from headlab.page.atlas import atlas_html

#: text that must show as text, never run or close the page's script
XSS = "</script><script>window.__pwned = 1</script>"


@pytest.fixture(scope="module")
def cards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The cards of a tiny Llama, written by the command with its atlas, and the JSON, with
    roles set apart (a random model's heads are all broad) and a token written as markup."""
    folder = build("llama", tmp_path_factory.mktemp("llama"), lm_head=True, seed=3)
    out = tmp_path_factory.mktemp("atlas")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADLAB_CACHE", str(out / "cache"))
        argv = ["cards", "--model", str(folder), "--n", "6", "-q"]
        html = out / "atlas.html"
        assert main([*argv, "--limit", "20", "--no-importance", "--html", str(html)]) == 0
        assert html.is_file() and not list(out.glob("*.tmp"))
        # the same run as JSON (the roles run is cached now: the same numbers again)
        assert main([*argv, "--no-importance", "--json", "--roles", _cached(out)]) == 0
    return {"folder": folder, "out": out}


def _cached(out: Path) -> str:
    (found,) = (out / "cache" / "roles").glob("*.json")
    return str(found)


@pytest.fixture(scope="module")
def data(cards: dict[str, Any]) -> dict[str, Any]:
    from headlab.experiments.cards import CardsRequest
    from headlab.models.loading import load

    lm = load(cards["folder"], with_lm_head=True)
    run = CardsRequest(model=str(cards["folder"]), roles=_cached(cards["out"]), n=6,
                       no_importance=True).run(lm).to_json()  # fmt: skip
    run = copy.deepcopy(run)
    for card, role in zip(run["cards"], ["induction", "sink", "previous-token"] * 3, strict=False):
        card["looks"] = {**card["looks"], "role": role}
    run["cards"][5]["writes"]["promoted"][0]["token"] = XSS
    return run


@pytest.fixture
def page(browser: Any, data: dict[str, Any], tmp_path: Path) -> Any:
    path = tmp_path / "atlas.html"
    path.write_text(atlas_html(data), encoding="utf-8")
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.errors = []
    page.requests = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("request", lambda r: page.requests.append(r.url))
    page.goto(path.as_uri() + "#1.2")
    page.wait_for_selector("body[data-ready='1']")
    yield page
    assert page.errors == []
    assert page.evaluate("window.__pwned") is None
    page.close()


def _listed(page: Any) -> list[str]:
    return page.eval_on_selector_all(
        "#list tr td:first-child a", "as => as.map(a => a.textContent)"
    )


def test_the_command_writes_an_atlas_that_opens(
    cards: dict[str, Any], browser: Any, tmp_path: Path
) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((cards["out"] / "atlas.html").as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert errors == [] and page.locator("#grid button").count() == 8
    page.close()


def test_opens_offline_on_the_permalink_and_every_card_is_reachable(
    page: Any, data: dict[str, Any], tmp_path: Path
) -> None:
    assert [u for u in page.requests if not u.startswith(("file://", "data:"))] == []
    assert page.locator("#card-title").text_content().startswith("Head 1.2 ")
    assert page.locator("#grid button").count() == len(data["cards"]) == 8
    for card in data["cards"]:
        page.click(f"#grid button[id='cell-{card['id']}']")
        assert page.locator("#card-title").text_content().startswith(f"Head {card['id']} ")
        assert page.locator("#card .verdict").text_content() == card["verdict"]
        assert page.evaluate("location.hash") == f"#{card['id']}"
        assert page.locator("#grid button.chosen").count() == 1
    # a card's numbers are the JSON's: its patching effects and its first promoted token
    page.goto(page.url.split("#")[0] + "#1.1")
    page.wait_for_selector("#card-title")
    text = page.locator("#card").text_content()
    effect = data["cards"][5]["does"]["patching"]["ioi"]
    assert f"{100 * effect:.2f}%" in text
    assert XSS in text  # a token shows as text
    examples = data["cards"][5]["looks"]["examples"]
    assert page.locator("#card .example").count() == len(examples) > 0
    first = examples[0]
    key = data["sample"][first["sentence"]][first["key"]]
    assert page.locator("#card .example >> nth=0").locator("span.k").first.text_content() == key
    page.screenshot(path=str(tmp_path / "atlas.png"), full_page=True)
    assert (tmp_path / "atlas.png").stat().st_size > 10_000


def test_the_filters_show_exactly_the_heads_that_match(page: Any, data: dict[str, Any]) -> None:
    every = [c["id"] for c in data["cards"]]
    assert _listed(page) == every
    page.select_option("#f-role", "sink")
    assert _listed(page) == [c["id"] for c in data["cards"] if c["looks"]["role"] == "sink"]
    assert page.locator("#grid button.dim").count() == 8 - len(_listed(page))
    page.click("#f-clear")
    page.select_option("#f-task", "induction")
    page.fill("#f-effect", "0.1")
    carried = [c["id"] for c in data["cards"] if c["does"]["patching"]["induction"] >= 0.1]
    assert _listed(page) == carried and 0 < len(carried) < 8
    page.click("#f-clear")
    token = data["cards"][2]["writes"]["promoted"][1]["token"].strip()
    page.fill("#f-token", token)
    writers = [
        c["id"]
        for c in data["cards"]
        if any(token.lower() in t["token"].strip().lower() for t in c["writes"]["promoted"])
    ]
    assert _listed(page) == writers and "0.2" in writers
    page.click("#list a >> nth=0")
    assert page.locator("#card-title").text_content().startswith(f"Head {writers[0]} ")
    assert page.locator("#f-count").text_content() == f"{len(writers)} of 8 heads"
    json.dumps(data)
