"""Shared test fixtures: paths to the shared gold data and small helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared gold data folder; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with headlab's native row kernels, then with torch's ops alone (as on a
    machine without a C compiler). CI must build the kernels: there, missing ones fail."""
    from headlab import native

    if request.param == "torch":
        monkeypatch.setitem(native._state, "lib", None)
        monkeypatch.setitem(native._state, "why", "turned off by the test")
    elif native.kernels() is None:
        if os.environ.get("CI"):
            pytest.fail(f"native kernels unavailable in CI: {native.why_not()}")
        pytest.skip(f"native kernels unavailable: {native.why_not()}")
    return str(request.param)
