"""headlab.native: the C row kernels agree with float64 torch, build once, and fall back cleanly."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from headlab import native
from headlab.native import build


@pytest.fixture(params=["native", "portable"])
def lib(request: pytest.FixtureRequest, select_kernels) -> object:
    """The kernels built for this CPU, then without their AVX-512 paths."""
    select_kernels(request.param)
    return native.kernels()


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """An empty kernel cache; the kernels are looked up again before and after the test."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path))
    native.reset()
    yield tmp_path
    monkeypatch.undo()
    native.reset()


@pytest.fixture
def loader(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`fresh`, with the loader's own decisions under test whatever ``HEADLAB_NATIVE``
    the suite runs with (these tests build nothing real, or only a refusal)."""
    monkeypatch.delenv("HEADLAB_NATIVE", raising=False)
    native.reset()
    return fresh


def built(folder: Path) -> list[Path]:
    """The libraries in a kernel cache (not their checksum files)."""
    return [p for p in folder.glob("rows-*") if not p.name.endswith(".sha256")]


def needs_kernels() -> None:
    if native.kernels() is None:
        pytest.skip(f"native kernels unavailable: {native.why_not()}")


@pytest.mark.parametrize("n_cols", [1, 5, 16, 37, 512])
def test_softmax_rows_match_float64(lib: object, n_cols: int) -> None:
    """Weights, each row's largest weight and entropy as float64 torch gives them; masked
    scores (-1e30) get exactly zero weight, a fully masked row uniform weights."""
    g = torch.Generator().manual_seed(n_cols)
    scores = torch.randn(3, 4, 7, n_cols, generator=g) * 4
    if n_cols > 3:
        scores[0, :, :, n_cols // 2 :] = -1e30
    scores[1, 2, 3] = -1e30
    weights = torch.empty_like(scores)
    top, entropy = torch.empty(3, 4, 7), torch.empty(3, 4, 7)
    native.softmax_rows(scores, weights, top, entropy)
    expect = torch.softmax(scores.double(), -1)
    assert (weights - expect).abs().max() < 2e-6
    assert torch.equal(top, weights.amax(-1))
    assert (entropy - -torch.xlogy(expect, expect).sum(-1)).abs().max() < 2e-5
    if n_cols > 3:
        assert bool((weights[0, :, :, n_cols // 2 :] == 0).all())
    assert torch.allclose(weights[1, 2, 3], torch.full((n_cols,), 1 / n_cols))


@pytest.mark.parametrize(("group", "causal", "extra"), [(1, False, 0), (3, True, 0), (2, True, 5)])
@pytest.mark.parametrize(("start", "rows"), [(0, 9), (6, 3), (11, 1)])
def test_attend_rows_match_torch(
    lib: object, group: int, causal: bool, extra: int, start: int, rows: int
) -> None:
    """Scores and softmax of a block of rows with right padding, the causal triangle (keys
    already cached: ``extra``) and key/value heads shared by ``group`` query heads, as float64
    torch computes them from the whole matrices; the queries read in place from a model's head
    view (token-major), the scale applied to the products, and the rows' sums of three key
    columns."""
    g = torch.Generator().manual_seed(start + rows)
    n_batch, n_kv, n_q, d = 3, 2, 12, 24
    n_keys = n_q + extra
    scale = 0.7
    tokens = torch.randn(n_batch, n_q, n_kv * group, d, generator=g) * 0.6  # (B, T, H, D)
    query = tokens.transpose(1, 2)  # (B, H, T, D), not contiguous
    keys = torch.randn(n_batch, n_kv, n_keys, d, generator=g)
    columns = torch.rand(n_batch, n_keys, 3, generator=g)
    lengths = torch.tensor([n_keys, n_keys - 4, 0])  # the last sentence sees no key at all
    stop = start + rows
    seen = min(n_keys, stop + extra) if causal else n_keys
    weights = torch.empty(n_batch, n_kv * group, rows, seen)
    top, entropy = (
        torch.empty(n_batch, n_kv * group, rows),
        torch.empty(n_batch, n_kv * group, rows),
    )
    mixed = torch.empty(n_batch, n_kv * group, rows, 3)
    native.attend_rows(
        query,
        keys.transpose(-2, -1).contiguous(),
        start,
        rows,
        seen,
        scale=scale,
        lengths=lengths,
        causal=causal,
        weights=weights,
        top=top,
        entropy=entropy,
        columns_t=columns.transpose(1, 2).contiguous(),
        mixed=mixed,
    )
    k = keys.double().repeat_interleave(group, dim=1)
    scores = scale * query.double()[:, :, start:stop] @ k.transpose(-2, -1)  # (B, H, t, S)
    visible = torch.arange(n_keys)[None, None, None, :] < lengths[:, None, None, None]
    if causal:
        row = torch.arange(start, stop)[:, None] + extra
        visible = visible & (torch.arange(n_keys)[None, :] <= row)
    expect = torch.softmax(scores.masked_fill(~visible, -1e30), -1)[..., :seen]
    assert (weights[:2] - expect[:2]).abs().max() < 2e-6
    assert torch.equal(top, weights.amax(-1))
    ent = -torch.xlogy(expect, expect).sum(-1)
    assert (entropy[:2] - ent[:2]).abs().max() < 2e-5
    assert (mixed[:2] - (expect @ columns[:, None, :seen].double())[:2]).abs().max() < 2e-6
    assert torch.allclose(weights[2], torch.full_like(weights[2], 1 / seen))  # no key: uniform
    assert torch.allclose(mixed[2], columns[2, :seen].mean(0).expand(mixed.shape[1:]))


def test_kernels_build_once_into_the_cache(fresh: Path) -> None:
    """The first use builds the library into ``$HEADLAB_CACHE``; a new process (here: a reset)
    loads that file instead of building again."""
    needs_kernels()
    libraries = built(fresh)
    assert len(libraries) == 1 and not list(fresh.glob(".rows-*"))  # no half-written file left
    stamp = libraries[0].stat().st_mtime_ns
    native.reset()
    assert native.kernels() is not None
    assert [p.stat().st_mtime_ns for p in built(fresh)] == [stamp]


def test_without_openmp_python_threads_split_the_rows(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler without OpenMP still gives working kernels: Python threads split the rows,
    with the same results."""
    if native.kernels() is None:
        pytest.skip(f"native kernels unavailable: {native.why_not()}")
    scores = torch.randn(4, 6, 100, generator=torch.Generator().manual_seed(1))
    out = [torch.empty_like(scores), torch.empty(4, 6), torch.empty(4, 6)]
    native.softmax_rows(scores, *out)
    monkeypatch.setattr(build, "OPENMP", ())
    native.reset()
    assert native.kernels().headlab_openmp() == 0
    again = [torch.empty_like(scores), torch.empty(4, 6), torch.empty(4, 6)]
    native.softmax_rows(scores, *again)
    for a, b in zip(out, again, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"HEADLAB_NATIVE": "0"}, "HEADLAB_NATIVE=0"),
        ({"CC": "/nonexistent/cc"}, "building the native kernels failed"),
    ],
)
def test_no_kernels_says_why(
    loader: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], reason: str
) -> None:
    """Turned off, or with a compiler that cannot run, headlab uses torch's ops and says why."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert native.kernels() is None
    assert reason in native.why_not()
    assert not list(loader.glob("*rows-*"))


def test_portable_kernels_leave_the_scores_to_torch(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built without AVX-512 (as on most laptops), the kernels are used for the softmax and the
    word argmax, but not for the scores' products, where MKL is faster."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the portable build is checked on x86")
    monkeypatch.setattr(build, "FLAGS", (*build.FLAGS, "-mno-avx512f"))
    if native.kernels() is None:
        pytest.skip(f"native kernels unavailable: {native.why_not()}")
    assert native.kernels().headlab_vector_bits() == 0
    assert not native.fused_scores()
    native.reset()
    monkeypatch.undo()
    assert native.fused_scores() == (native.kernels().headlab_vector_bits() >= 512)


def test_cli_note_only_when_the_build_fails(
    fresh: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from headlab.cli._output import native_note

    monkeypatch.setenv("HEADLAB_NATIVE", "0")
    native_note("headlab roles")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("HEADLAB_NATIVE", "1")
    monkeypatch.setenv("CC", "/nonexistent/cc")
    native.reset()
    native_note("headlab roles")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("headlab roles: note: building the native")


def test_no_build_where_no_avx512_can_be(loader: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off x86 (Apple silicon, other ARM CPUs) there are no AVX-512 paths to build: headlab
    does not run the compiler and keeps torch's ops, by design."""
    import platform

    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert native.kernels() is None and native.by_choice()
    assert "arm64" in native.why_not()
    assert not list(loader.iterdir())


def test_an_unwritable_cache_names_the_way_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder that cannot be created: torch's ops, and a reason that says which folder
    and what to set."""
    monkeypatch.delenv("HEADLAB_NATIVE", raising=False)
    monkeypatch.setenv("HEADLAB_CACHE", "/proc/headlab-cannot-be-here")
    native.reset()
    try:
        assert native.kernels() is None
        why = native.why_not()
    finally:
        monkeypatch.undo()
        native.reset()
    assert "/proc/headlab-cannot-be-here" in why and "HEADLAB_CACHE" in why


# The kernel cache against faults and tampering (issue #25, item 9) and the argument table.

C_TYPES = {"int64_t": "i", "int32_t": "b", "double": "d"}


def c_signatures() -> dict[str, str]:
    """Each exported kernel's parameter kinds read from the definitions in ``rows.c`` (a
    pointer: ``p``, whether or not it may be NULL)."""
    import re

    source = build.SOURCE.read_text()
    found = {}
    for name, params in re.findall(r"^void (\w+)\(([^)]*)\)", source, flags=re.M):
        kinds = []
        for param in params.split(","):
            words = param.replace("*", " * ").split()
            kinds.append("p" if "*" in words else C_TYPES[words[-2]])
        found[name] = "".join(kinds)
    return found


def test_the_exported_table_is_the_c_functions_and_headlabs() -> None:
    """``headlab_signatures()`` in ``rows.c`` describes the C definitions' parameters, and
    headlab's ctypes signatures equal it (read from the source: no build needed)."""
    import re

    body = re.search(
        r"headlab_signatures\(void\) \{\s*return (.*?);\s*\}", build.SOURCE.read_text(), re.S
    )
    assert body is not None
    table = "".join(re.findall(r'"([^"]*)"', body.group(1)))
    exported = build._parse_signatures(table)
    assert exported == build._SIGNATURES
    assert {k: v.replace("q", "p") for k, v in exported.items()} == c_signatures()
    assert build._signature_mismatch(table) == ""


def test_a_mismatched_argument_table_is_refused(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library whose argument table differs from headlab's signatures is not used: torch's
    ops run, and the reason names the kernel and both tables' entries."""
    needs_kernels()
    changed = dict(build._SIGNATURES, attend_rows=build._SIGNATURES["attend_rows"] + "i")
    monkeypatch.setattr(build, "_SIGNATURES", changed)
    native.reset()
    assert native.kernels() is None
    why = native.why_not()
    assert "attend_rows" in why and "argument table" in why and changed["attend_rows"] in why
    assert not native.by_choice()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "checksum lost"])
def test_a_damaged_cached_library_is_built_again(fresh: Path, damage: str) -> None:
    """A cached library cut short (a kill during a copy, a full disk), replaced by other bytes,
    or without its checksum is not loaded (a truncated one crashed with SIGBUS): its checksum
    does not match, so it is built again and works."""
    needs_kernels()
    (library,) = built(fresh)
    whole = library.read_bytes()
    # a new file renamed over the old one, as a later process finds it (this process still
    # maps the old one: writing into that file would crash it)
    other = fresh / "other"
    if damage == "truncated":
        other.write_bytes(whole[: len(whole) // 3])
        os.replace(other, library)
    elif damage == "garbage":
        other.write_bytes(b"\x7fELF not a library" * 100)
        os.replace(other, library)
    else:
        build._checksum_path(library).unlink()
    native.reset()
    assert native.kernels() is not None
    assert build._verified(library) and library.stat().st_size == len(whole)
    scores = torch.randn(2, 5, 9)
    out = [torch.empty_like(scores), torch.empty(2, 5), torch.empty(2, 5)]
    native.softmax_rows(scores, *out)
    assert (out[0] - torch.softmax(scores, -1)).abs().max() < 1e-6


def test_a_cache_others_can_write_is_refused(loader: Path) -> None:
    """A cache folder that group or others may write (a library placed there would run as the
    user): torch's ops, a reason naming the folder and the way out, and no build."""
    loader.chmod(0o777)
    assert native.kernels() is None
    why = native.why_not()
    assert str(loader) in why and "written by others" in why and "HEADLAB_CACHE" in why
    assert not list(loader.iterdir())


def test_cc_with_flags_is_split_like_shell_words(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CC="gcc -O0"`` is a compiler and a flag, as in make, not one program's name."""
    import shutil

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found")
    monkeypatch.setenv("CC", f"{gcc} -O0")
    native.reset()
    needs_kernels()
    assert len(built(fresh)) == 1


def test_a_hanging_compiler_is_given_up_after_the_timeout(
    loader: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A compiler that never finishes is stopped after ``HEADLAB_CC_TIMEOUT`` seconds, once
    (not again without OpenMP), and the reason says so and how to change the limit."""
    bin_dir = tmp_path_factory.mktemp("fake-cc")
    calls = bin_dir / "calls"
    script = bin_dir / "cc"
    script.write_text(f"#!/bin/sh\necho run >> '{calls}'\nexec sleep 60\n")
    script.chmod(0o755)
    monkeypatch.setenv("CC", f"'{script}' -O2")
    monkeypatch.setenv("HEADLAB_CC_TIMEOUT", "0.5")
    assert native.kernels() is None
    why = native.why_not()
    assert "did not finish in 0.5 s" in why and "HEADLAB_CC_TIMEOUT" in why
    assert calls.read_text().count("run") == 1
    assert not built(loader)


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"CC": "gcc 'unclosed"}, "CC cannot be split into words"),
        ({"HEADLAB_CC_TIMEOUT": "soon"}, "HEADLAB_CC_TIMEOUT must be a positive number"),
        ({"HEADLAB_CC_TIMEOUT": "-1"}, "HEADLAB_CC_TIMEOUT must be a positive number"),
    ],
)
def test_unusable_compiler_settings_say_why(
    loader: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], reason: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert native.kernels() is None
    assert reason in native.why_not()
