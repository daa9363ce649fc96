"""Models bigger than one device: ``--device-map``, ``--max-memory`` and ``--offload-folder``.

A :class:`Placement` says where a model's modules go. A strategy (``auto``, ``balanced``,
``balanced_low_0``, ``sequential``) is turned into a module -> device map by accelerate's
``infer_auto_device_map`` on an empty (meta) copy of the model, under the budgets of
``max_memory``; an explicit map (JSON of module name -> device) is used as given. Either way the
map is checked here, before any weight is read, and handed to transformers' ``from_pretrained``
(``device_map=``), which places the weights and lets accelerate's hooks move each layer's inputs
to the device that layer runs on. Modules mapped to ``"cpu"`` on a machine with GPUs, or to
``"disk"`` (weights in ``offload_folder``), are *offloaded*: their weights come to the execution
device for the layer's forward and leave after it.

headlab's statistics follow the tensors: each layer's attention blocks, probes and sums are
computed on the device of that layer's queries; sums come to one device when a corpus is done.

Nothing here imports torch or accelerate at import time (``headlab --help`` stays fast).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headlab.errors import InputError, PruningError

#: accelerate's placement strategies
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)

#: a device of a map or a budget: a GPU index, ``cuda:N``, ``cpu``, ``mps``, ``disk``
Device = int | str


@dataclass(frozen=True)
class Placement:
    """Where a model's modules go.

    Attributes:
        device_map: a strategy from :data:`STRATEGIES`, or module name -> device (a GPU index,
            ``"cpu"``, ``"mps"`` or ``"disk"``; ``""`` names the whole model).
        max_memory: device -> bytes it may hold (``None``: what each device has free).
        offload_folder: where modules mapped to ``"disk"`` keep their weights.
    """

    device_map: str | Mapping[str, Device] = "auto"
    max_memory: Mapping[Device, int] | None = None
    offload_folder: Path | None = None
    source: str = field(default="", compare=False)  # how the user wrote it, for messages

    def __post_init__(self) -> None:
        if isinstance(self.device_map, str) and self.device_map not in STRATEGIES:
            raise InputError(
                f"device map must be one of {', '.join(STRATEGIES)} or a module -> device "
                f"mapping, got {self.device_map!r}"
            )
        if isinstance(self.device_map, Mapping):
            if not self.device_map:
                raise InputError("the device map is empty (expected module name -> device)")
            for module, device in self.device_map.items():
                if not isinstance(module, str):
                    raise InputError(f"device map keys must be module names, got {module!r}")
                _device(device, f"device map entry {module!r}")
        for device, size in (self.max_memory or {}).items():
            _device(device, "--max-memory")
            if device == "disk":
                raise InputError("--max-memory takes GPUs, cpu or mps; disk has no budget")
            if not isinstance(size, int) or size < 0:
                raise InputError(f"--max-memory for {device}: expected bytes >= 0, got {size!r}")


def _device(value: object, where: str) -> Device:
    """``value`` as a device name a map may hold (GPU indices as ints); a one-line error
    naming ``where`` otherwise."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        if value < 0:
            raise InputError(f"{where}: a GPU index must be 0 or more, got {value}")
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        if name in ("cpu", "disk", "mps"):
            return name
        match = re.fullmatch(r"(?:cuda:)?(\d+)", name)
        if match:
            return int(match.group(1))
    raise InputError(
        f"{where}: unknown device {value!r} (expected a GPU index like 0, cuda:0, cpu, mps or disk)"
    )


def parse_size(text: str, where: str = "--max-memory") -> int:
    """Bytes of ``20GiB``, ``500MB``, ``1.5GB`` or a plain number of bytes."""
    match = _SIZE.match(text)
    if not match:
        raise InputError(
            f"{where}: cannot read the size {text!r} (expected a number with an optional unit "
            "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. 20GiB)"
        )
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def parse_max_memory(text: str) -> dict[Device, int]:
    """``0=20GiB,1=20GiB,cpu=64GiB`` as device -> bytes."""
    budgets: dict[Device, int] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        device_text, eq, size = item.partition("=")
        if not eq or not device_text.strip() or not size.strip():
            raise InputError(
                f"--max-memory: cannot read {item.strip()!r} (expected DEVICE=SIZE items "
                "separated by commas, e.g. 0=20GiB,1=20GiB,cpu=64GiB)"
            )
        device = _device(device_text, "--max-memory")
        if device == "disk":
            raise InputError("--max-memory takes GPUs, cpu or mps; disk has no budget")
        if device in budgets:
            raise InputError(f"--max-memory names {device_text.strip()!r} twice")
        budgets[device] = parse_size(size, f"--max-memory {device_text.strip()}")
    if not budgets:
        raise InputError("--max-memory is empty (expected e.g. 0=20GiB,cpu=64GiB)")
    return budgets


def parse_device_map(text: str) -> str | dict[str, Device]:
    """A strategy name, inline JSON ``{"module": device}``, or a JSON file of the same."""
    text = text.strip()
    if text in STRATEGIES:
        return text
    if text.startswith("{"):
        raw, origin = text, "inline JSON"
    else:
        path = Path(text)
        if not path.is_file():
            raise InputError(
                f"--device-map must be {', '.join(STRATEGIES)}, a JSON file or inline JSON of "
                f"module -> device; {text!r} is none of these"
            )
        try:
            raw = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--device-map: cannot read {path} ({exc})") from None
        origin = str(path)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"--device-map {origin}: not valid JSON ({exc.msg} at {exc.pos})"
        ) from None
    if not isinstance(value, dict):
        raise InputError(f"--device-map {origin}: expected a JSON object of module -> device")
    return {str(k): _device(v, f"--device-map {origin} entry {k!r}") for k, v in value.items()}


def placement_from_options(
    device_map: str | None, max_memory: str | None, offload_folder: str | None
) -> Placement | None:
    """The :class:`Placement` of the command-line options; ``None`` when none was given.

    ``--max-memory`` or ``--offload-folder`` alone imply ``--device-map auto``.
    """
    if device_map is None and max_memory is None and offload_folder is None:
        return None
    parsed = parse_device_map(device_map) if device_map is not None else "auto"
    budgets = parse_max_memory(max_memory) if max_memory is not None else None
    folder = Path(offload_folder) if offload_folder is not None else None
    if folder is not None and folder.exists() and not folder.is_dir():
        raise InputError(f"--offload-folder {folder} exists and is not a folder")
    return Placement(device_map=parsed, max_memory=budgets, offload_folder=folder)


#: the parameter dtypes a command may load a model in
DTYPES = ("float32", "bfloat16", "float16")


def parse_dtype(name: str | None) -> Any:
    """The ``torch.dtype`` named by ``--dtype`` (default float32).

    Raises:
        InputError: a name outside :data:`DTYPES`.
    """
    import torch

    name = name or "float32"
    if name not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def parse_device(name: str | None) -> Any:
    """The ``torch.device`` named by ``--device`` (default: cuda when available, else cpu),
    checked to exist on this machine.

    Raises:
        InputError: a malformed name, or a device this machine lacks.
    """
    import torch

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


def _human(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _check_devices(devices: list[Device], where: str) -> None:
    """Every GPU index or ``mps`` named exists on this machine."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device in devices:
        if isinstance(device, int) and device >= count:
            have = f"GPUs 0..{count - 1}" if count else "no CUDA GPU"
            raise InputError(f"{where} names GPU {device}; this machine has {have}")
        if device == "mps" and not torch.backends.mps.is_available():
            raise InputError(f"{where} names mps; MPS is not available on this machine")


def _blocks(model: Any, no_split: list[str]) -> dict[str, int]:
    """Bytes of every module that must stay on one device (a layer: ``_no_split_modules``)."""
    from accelerate.utils import compute_module_sizes

    sizes = compute_module_sizes(model)
    return {
        name: sizes[name]
        for name, module in model.named_modules()
        if type(module).__name__ in no_split and name in sizes
    }


def resolve(placement: Placement, model: Any, *, folder: Path | str = "model") -> dict[str, Device]:
    """The module -> device map of ``placement`` for ``model`` (an empty, meta-device copy:
    :func:`empty_model`), checked.

    Raises:
        InputError: a strategy on a model class without ``_no_split_modules``; a budget that
            cannot hold one layer; a GPU that does not exist; modules on ``"disk"`` with no
            offload folder; an explicit map naming modules the model lacks or leaving
            weights out.
    """
    budgets = dict(placement.max_memory or {})
    _check_devices(list(budgets), "--max-memory")
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    blocks = _blocks(model, no_split) if no_split else {}
    if isinstance(placement.device_map, str):
        if not no_split:
            raise InputError(
                f"{folder}: {type(model).__name__} does not say which modules must stay on one "
                f"device (no _no_split_modules), so --device-map {placement.device_map} cannot "
                "split it; give an explicit JSON map of module -> device instead"
            )
        largest_name, largest = max(blocks.items(), key=lambda kv: kv[1])
        for device, size in budgets.items():
            if size < largest:
                raise InputError(
                    f"--max-memory {device}={_human(size)} cannot hold one layer ({largest_name}: "
                    f"{_human(largest)}); give it more or leave it out"
                )
        device_map = _infer(model, placement.device_map, budgets or None, no_split)
    else:
        device_map = dict(placement.device_map)
        _check_devices(list(device_map.values()), "--device-map")
        _check_covers(model, device_map, folder)
    if "disk" in device_map.values() and placement.offload_folder is None:
        on_disk = [name for name, device in device_map.items() if device == "disk"]
        raise InputError(
            f"{folder}: {len(on_disk)} module(s) go to disk ({', '.join(on_disk[:3])}"
            f"{'...' if len(on_disk) > 3 else ''}) and need --offload-folder DIR"
        )
    return device_map


def _infer(
    model: Any, strategy: str, budgets: dict[Device, int] | None, no_split: list[str]
) -> dict[str, Device]:
    """accelerate's placement of ``model`` by ``strategy`` (what transformers does for
    ``device_map="auto"``)."""
    from accelerate.utils import get_balanced_memory, get_max_memory, infer_auto_device_map

    if strategy == "sequential":
        memory = get_max_memory(budgets)
    else:
        memory = get_balanced_memory(
            model,
            max_memory=budgets,
            no_split_module_classes=no_split,
            low_zero=strategy == "balanced_low_0",
        )
    return dict(infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split))


def _check_covers(model: Any, device_map: Mapping[str, Device], folder: Path | str) -> None:
    """An explicit map names only modules of the model and places every weight."""
    modules = {name for name, _ in model.named_modules()}
    unknown = [name for name in device_map if name not in modules]
    if unknown:
        raise InputError(
            f"--device-map names {unknown[0]!r}, which {folder} does not have (its top modules: "
            f"{', '.join(name for name, _ in model.named_children())})"
        )
    placed = tuple(name for name in device_map)

    def covered(tensor_name: str) -> bool:
        return any(p == "" or tensor_name == p or tensor_name.startswith(p + ".") for p in placed)

    missing = [n for n, _ in model.named_parameters() if not covered(n)]
    if missing:
        raise InputError(
            f"--device-map places no device for {len(missing)} weight(s) of {folder} "
            f"({', '.join(missing[:3])}{'...' if len(missing) > 3 else ''})"
        )


def empty_model(auto: Any, config: Any, dtype: Any) -> Any:
    """The model ``auto`` builds from ``config``, with every weight on the meta device
    (no memory), for planning."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        return auto.from_config(config, dtype=dtype)


def main_device(device_map: Mapping[str, Device]) -> Any:
    """The device a dispatched model's inputs go to: accelerate's main device, the first
    accelerator of the map, else the CPU."""
    import torch

    for device in device_map.values():
        if device not in ("cpu", "disk"):
            return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return torch.device("cpu")


def offloaded(device_map: Mapping[str, Device] | None) -> list[str]:
    """Modules whose weights live away from where they run: on disk, or on the CPU while the
    model runs on an accelerator."""
    if not device_map:
        return []
    on_accelerator = main_device(device_map).type != "cpu"
    return [
        name
        for name, device in device_map.items()
        if device == "disk" or (device == "cpu" and on_accelerator)
    ]


def refuse_offloaded(device_map: Mapping[str, Device] | None, what: str) -> None:
    """A one-line error when ``what`` needs to rewrite weights that are offloaded."""
    away = offloaded(device_map)
    if away:
        raise PruningError(
            f"{what} rewrites weights, and {len(away)} module(s) are offloaded ({', '.join(away[:3])}"
            f"{'...' if len(away) > 3 else ''}); load the model without offload "
            "(more --max-memory on a GPU or the CPU, no disk)"
        )


@contextmanager
def aligned(module: Any, device: Any) -> Iterator[None]:
    """Inside the block, the weights of ``module`` are real tensors even when its layer is
    offloaded (accelerate's hooks otherwise keep them on the meta device between forward
    passes); a module that is not offloaded is left as it is."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None or not getattr(hook, "offload", False):
        yield
        return
    from accelerate.utils import align_module_device

    with align_module_device(module, execution_device=device):
        yield
