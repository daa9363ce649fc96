"""The notebook view in a real Jupyter kernel (#46, item 8): docs/notebooks/capture.ipynb runs
in ipykernel through nbclient, and the HTML it saved opens in Chromium with the grid, offline,
with no console error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.serve.conftest import watch

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "notebooks" / "capture.ipynb"


@pytest.fixture(scope="module")
def executed() -> object:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    client = NotebookClient(nb, timeout=300, kernel_name="python3", env=env)  # type: ignore[no-untyped-call]
    client.execute()
    return nb


def _result(cell: object) -> object:
    """The cell's value as Jupyter shows it (after any printed lines or notes)."""
    found = [o for o in cell.outputs if o.output_type == "execute_result"]  # type: ignore[attr-defined]
    assert len(found) == 1, cell.outputs  # type: ignore[attr-defined]
    return found[0]


def test_the_example_notebook_runs_in_a_kernel(executed: object) -> None:
    cells = [c for c in executed.cells if c.cell_type == "code"]  # type: ignore[attr-defined]
    assert all(o.output_type != "error" for c in cells for o in c.outputs)
    noise = "".join(o.text for c in cells for o in c.outputs if o.get("name") == "stderr")
    # no loading bar in the notebook's output, and not tqdm's note that ipywidgets is missing
    # either (transformers' first import, inside headlab's load, made it: #58)
    assert "Loading weights" not in noise and "headlab" not in noise, noise
    assert "IProgress" not in noise and "TqdmWarning" not in noise, noise
    shown = _result(cells[0])
    assert "text/html" in shown.data and "hl-notebook" in shown.data["text/html"]
    printed = "".join(o.get("text", "") for o in cells[1].outputs)
    assert printed.startswith("torch.Size([") and "To" in printed  # the sink: the first word
    top = _result(cells[1]).data["text/plain"]
    assert top.startswith("[(") and "To'" not in top.split(")")[0]


@pytest.mark.slow
def test_its_saved_output_draws_the_grid_in_chromium(executed: object, browser) -> None:
    html = _result(executed.cells[1]).data["text/html"]  # type: ignore[attr-defined]
    page = watch(browser.new_page())
    page.set_content("<html><body>" + html + "</body></html>")
    page.wait_for_function("() => document.querySelector('.hl-notebook[data-ready=\"1\"]')")
    assert page.locator(".hl-grid button").count() == 16  # 4 layers x 4 heads
    page.locator(".hl-grid button[data-layer='3'][data-head='1']").click()
    assert page.locator(".hl-view").get_attribute("data-head") == "1"
    assert page.locator(".hl-lines svg line").count() >= 1
    assert page.errors == []
    assert [u for u in page.requests if u != "about:blank"] == []
    page.close()
