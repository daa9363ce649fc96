"""The options every command that loads a model shares: ``--model``'s neighbours
``--revision``, ``--device``, ``--dtype`` and, for models bigger than one device,
``--device-map``, ``--max-memory`` and ``--offload-folder``, checked in one place and passed to
:func:`headlab.models.load`.

Nothing here imports torch at import time (``headlab --help`` stays fast).
"""

from __future__ import annotations

import argparse
from typing import Any

from headlab.cli._output import note
from headlab.cli._progress import is_rank_zero
from headlab.errors import InputError, ModalityError
from headlab.models.dispatch import DTYPES, parse_device, parse_dtype, placement_from_options
from headlab.models.names import GGUF_MODELS

#: what ``--model`` takes, in every command that loads a model
MODEL_HELP = (
    "a model folder, tiny-shakespeare, "
    + ", ".join(f"{m.key} ({m.summary}, from {m.packages[0]})" for m in GGUF_MODELS.values())
    + ", a .gguf file, or a Hugging Face model name (downloaded into its cache the first time "
    "unless --offline) (default: all-MiniLM-L6-v2)"
)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--revision``, ``--device`` and ``--dtype`` to a command's parser."""
    parser.add_argument(
        "--revision",
        help="with a Hugging Face model name: its branch, tag or commit",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="never download: a model name must be in the Hugging Face cache already (as "
        "HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1)",
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
    parser.add_argument(
        "--device-map",
        metavar="MAP",
        help="spread the model over devices with accelerate: auto, balanced, balanced_low_0, "
        "sequential, or a JSON file or inline JSON of module -> device (0, cpu, disk)",
    )
    parser.add_argument(
        "--max-memory",
        metavar="BUDGETS",
        help="what each device may hold, e.g. 0=20GiB,1=20GiB,cpu=64GiB (implies "
        "--device-map auto)",
    )
    parser.add_argument(
        "--offload-folder",
        metavar="DIR",
        help="where layers that fit on no device keep their weights (disk offload)",
    )


def model_dtype(args: argparse.Namespace) -> Any:
    """The ``torch.dtype`` of ``--dtype``; a one-line error for any other value."""

    return parse_dtype(getattr(args, "dtype", None))


def model_device(args: argparse.Namespace) -> Any:
    """The ``torch.device`` of ``--device`` (default: cuda when available, else cpu), checked to
    exist on this machine; a one-line error otherwise."""

    return parse_device(getattr(args, "device", None))


def model_placement(args: argparse.Namespace) -> Any:
    """The :class:`~headlab.models.dispatch.Placement` of ``--device-map``, ``--max-memory`` and
    ``--offload-folder`` (``None`` when none is given); a one-line error for a malformed one."""

    placement = placement_from_options(
        getattr(args, "device_map", None),
        getattr(args, "max_memory", None),
        getattr(args, "offload_folder", None),
    )
    if placement is not None and getattr(args, "device", None) is not None:
        raise InputError("give --device (one device) or --device-map (several), not both")
    return placement


def load_model(args: argparse.Namespace, **kwargs: Any) -> Any:
    """:func:`headlab.models.load` of ``--model`` on ``--device`` (or spread by ``--device-map``)
    in ``--dtype`` (checked before anything is loaded); ``kwargs`` go to ``load`` too."""
    from headlab.distributed import local_device
    from headlab.models import load

    dtype, placement = model_dtype(args), model_placement(args)
    quiet_downloads(args)
    # under torchrun each rank of a machine takes its own GPU
    device = local_device(model_device(args)) if placement is None else "cpu"
    revision = getattr(args, "revision", None)
    try:
        return load(
            getattr(args, "model", None),
            dtype=dtype,
            device=device,
            revision=revision,
            offline=bool(getattr(args, "offline", False)),
            placement=placement,
            notify=_notifier(args),
            **kwargs,
        )
    except ModalityError as exc:
        if exc.reads == "images" and hasattr(args, "image"):  # the command takes --image
            raise ModalityError(
                f"{exc}: give it an image with --image FILE", reads=exc.reads
            ) from None
        raise


def quiet_downloads(args: argparse.Namespace) -> None:
    """No transformers progress bars (downloads, loading shards) unless ``--verbose``."""
    if not getattr(args, "verbose", False):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def _notifier(args: argparse.Namespace) -> Any:
    """What prints the one line saying a GGUF file is being converted (nothing with -q, and
    on one rank only under torchrun)."""
    if getattr(args, "quiet", False) or not is_rank_zero():
        return None
    return lambda message: note("headlab", message)
