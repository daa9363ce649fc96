"""A patching request checked before any work: the options that go together, the output
paths, and a model that reads next-token logits (told from its name, not loaded).

``headlab patch`` calls :func:`check_request` and :func:`check_model`, then loads the model and
runs :func:`headlab.causal.patching.run_patching` (or DLA, or path patching).
"""

from __future__ import annotations

from pathlib import Path

from headlab.errors import InputError


def check_request(
    *,
    method: str,
    component: str = "z",
    compare: bool = False,
    to: str | None = None,
    path: str | None = None,
    prompts: str | None = None,
    write: str | None = None,
    figure: str | None = None,
    csv_out: str | None = None,
    csv: bool = False,
) -> None:
    """Check the output paths (``write``, ``figure``, ``csv_out``: suffix and folder) and that
    the options go together: a path-patching receiver ``to`` (and sender ``path``), the
    ``method`` and ``component``, a ``compare`` of a gradient estimate.

    Raises:
        InputError: one line naming the option.
    """
    for flag, value, suffix in (
        ("--write", write, ".jsonl"),
        ("--figure", figure, ".png"),
        ("--csv-out", csv_out, ".csv"),
    ):
        if value is None:
            continue
        where = Path(value)
        if where.suffix.lower() != suffix:
            raise InputError(f"{flag} {value}: expected a {suffix} file")
        if not where.parent.is_dir():
            raise InputError(f"{flag} {value}: folder {where.parent} does not exist")
    if write and prompts:
        raise InputError("--write writes a built-in task's prompts: give --task, not --prompts")
    if compare and method == "activation":
        raise InputError("--compare compares a gradient estimate: add --method attribution or ig")
    if path is not None and to is None:
        raise InputError("--path names a sender: add --to q|k|v:L.H or --to logits")
    if to is not None:
        from headlab.causal.paths import parse_head, parse_receiver

        parse_receiver(to)
        if path is not None:
            parse_head(path)
        if method != "activation" or component != "z" or compare:
            raise InputError("--to is path patching: no --method, --component or --compare")
    if method == "dla" and (figure or csv_out or csv or compare):
        raise InputError("--method dla gives a table or --json; no --figure, CSV or --compare")
    if component != "z" and method != "activation":
        raise InputError(f"--component {component} is patched by --method activation only")


def check_model(model: str, prompts: str | None = None) -> None:
    """Check, without loading it, that ``model`` is a causal language model with its head
    (where its name or folder tells), and read ``prompts`` (a malformed file costs no model
    load).

    Raises:
        InputError: a model that reads no next-token logits.
        DataFormatError: a malformed prompts file.
    """
    from headlab.models.names import resolve

    folder_config = Path(model) / "config.json"
    readable = not Path(model).is_dir() or folder_config.is_file()  # else load() says why
    if readable and resolve(model).causal is False:
        raise InputError(
            f"--model {model}: patching reads next-token logits, and this is not a causal "
            "language model with its head (its config.json names no ...ForCausalLM or "
            "...LMHeadModel architecture)"
        )
    if prompts:
        from headlab.causal.tasks import read_prompts

        read_prompts(prompts)
