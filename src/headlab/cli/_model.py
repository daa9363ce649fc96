"""The options every command that loads a model shares: ``--model``'s neighbours
``--revision``, ``--device`` and ``--dtype``, checked in one place and passed to
:func:`headlab.models.load`.

Nothing here imports torch at import time (``headlab --help`` stays fast).
"""

from __future__ import annotations

import argparse
from typing import Any

from headlab.errors import InputError

#: the parameter dtypes a command may load a model in
DTYPES = ("float32", "bfloat16", "float16")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--revision``, ``--device`` and ``--dtype`` to a command's parser."""
    parser.add_argument(
        "--revision",
        help="with a model name from the Hugging Face cache: its branch, tag or commit",
    )
    parser.add_argument(
        "--device",
        help="where the model and every statistic run: cpu, cuda, cuda:N or mps (default: cuda "
        "when available, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        metavar="{" + ",".join(DTYPES) + "}",
        help="the model's parameter dtype (default float32); softmax and statistics stay float32",
    )


def model_dtype(args: argparse.Namespace) -> Any:
    """The ``torch.dtype`` of ``--dtype``; a one-line error for any other value."""
    import torch

    name = getattr(args, "dtype", None) or "float32"
    if name not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def model_device(args: argparse.Namespace) -> Any:
    """The ``torch.device`` of ``--device`` (default: cuda when available, else cpu), checked to
    exist on this machine; a one-line error otherwise."""
    import torch

    name = getattr(args, "device", None)
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InputError(f"--device must be cpu, cuda, cuda:N or mps, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {name}: CUDA is not available on this machine")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise InputError(f"--device {name}: this machine has CUDA devices 0..{count - 1}")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise InputError(f"--device {name}: MPS is not available on this machine")
    elif device.type != "cpu":
        raise InputError(f"--device must be cpu, cuda, cuda:N or mps, got {name!r}")
    return device


def load_model(args: argparse.Namespace, **kwargs: Any) -> Any:
    """:func:`headlab.models.load` of ``--model`` on ``--device`` in ``--dtype`` (checked before
    anything is loaded); ``kwargs`` go to ``load`` too."""
    from headlab.distributed import local_device
    from headlab.models import load

    # under torchrun each rank of a machine takes its own GPU
    dtype, device = model_dtype(args), local_device(model_device(args))
    revision = getattr(args, "revision", None)
    return load(
        getattr(args, "model", None), dtype=dtype, device=device, revision=revision, **kwargs
    )
