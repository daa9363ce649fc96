"""Which heads carry a behaviour: activation patching and its gradient estimates, per head.

**Activation patching** (Meng et al. 2022; Wang et al. 2022; Heimersheim and Nanda 2024, "How to
use and interpret activation patching"): run the clean prompt, but with one head's output (its
slice of the output projection's input) taken from the corrupted prompt's run, at every position
or at one. The head's effect is how much of the clean-corrupt gap in the metric that one swap
closes::

    effect = (LD_clean - LD_patched) / (LD_clean - LD_corrupt)

1 when the swap alone turns clean into corrupt, 0 when the head does not matter, negative when
the corrupted output helps the behaviour. LDs are means over the task's prompts. Every head is
patched exactly (no approximation), but not one forward pass per head: the heads of a layer are
stacked as copies of the batch (a head axis), and each copy starts at the patched layer from the
clean run's residual stream there (the layers below are the clean run's, unchanged).

**Attribution patching** (Nanda 2023; Syed et al. 2023, EAP): the first-order estimate of the
same quantity from one clean forward, one corrupted forward and one backward pass:
``LD_clean - LD_patched ~ (z_clean - z_corrupt) . dLD/dz`` at the clean run, per head ``z``.
**Integrated gradients** (``method="ig"``; Hanna et al. 2024, EAP-IG) average that gradient over
``steps`` points on the straight line from the corrupted to the clean input embeddings, which
follows the metric where it is not linear in the head. Both report their Pearson correlation
with activation patching when that was measured in the same run.

Shape vocabulary: ``L`` layers, ``H`` heads, ``N`` copies, ``B`` prompts, ``T`` tokens, ``D``
head width, ``V`` vocabulary.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headlab.causal.activation import (  # noqa: F401 (the module's public names)
    COMPONENTS,
    activation_patching,
    layer_patching,
)
from headlab.causal.attribution import attribution_patching
from headlab.causal.generators import BUILTIN, builtin_prompts
from headlab.causal.metric import (  # noqa: F401
    IG_STEPS,
    MAX_ROWS,
    METHODS,
    POSITIONS,
    Method,
    check_task,
    last_logits,
    logit_difference,
    parse_position,
)
from headlab.causal.result import LAYER_PARTS, LayerTable, PatchingResult  # noqa: F401
from headlab.causal.table import correlations, pearson, spearman  # noqa: F401
from headlab.causal.tasks import Prompt, Task, encode_task, parse_prompt, read_prompts
from headlab.errors import InputError
from headlab.models.folder import display_name
from headlab.models.loading import LoadedModel, wrap
from headlab.models.loading import LoadedModel as Loaded
from headlab.progress import Progress


def run_patching(
    lm: LoadedModel,
    task: Task,
    *,
    method: Method = "activation",
    position: int | None = None,
    component: str = "z",
    source: str = "corrupt",
    steps: int = IG_STEPS,
    compare: bool = False,
    layer_table: bool = False,
    layers: Sequence[int] | None = None,
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Activation patching (``source``: what replaces a head's output, as
    :func:`~headlab.causal.activation.activation_patching` takes it), or a gradient estimate
    with (when ``compare``) activation patching run first, for the correlations and top heads of
    both; ``layer_table``: also each layer's residual stream, attention and MLP output
    (activation patching, in the result's ``layers``)."""

    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if component != "z" and method != "activation":
        raise InputError(f"component {component!r} is patched by activation patching only")
    if source != "corrupt" and method != "activation":
        raise InputError(f"source {source!r} is patched by activation patching only")

    def activation() -> PatchingResult:
        return activation_patching(
            lm,
            task,
            position=position,
            layers=layers,
            component=component,
            source=source,
            max_rows=max_rows,
            progress=progress,
        )

    reference = activation() if method == "activation" or compare else None
    if method == "activation":
        result = reference
    else:
        result = attribution_patching(
            lm,
            task,
            method=method,
            steps=steps,
            position=position,
            compare=reference,
            progress=progress,
        )
    if result is None:  # pragma: no cover - activation always gives one
        raise RuntimeError("no patching result")
    if layer_table:  # its time counts in the result's seconds, as the run's
        start = time.perf_counter()
        table = layer_patching(lm, task, position=position, progress=progress)
        seconds = result.seconds + time.perf_counter() - start
        result = dataclasses.replace(result, layers=table, seconds=seconds)
    return result


def patch_heads(
    model: Any,
    tokenizer: Any = None,
    prompts: Any = "ioi",
    *,
    method: Method = "activation",
    position: str | int | None = "all",
    component: str = "z",
    source: str = "corrupt",
    steps: int = IG_STEPS,
    compare: bool = False,
    layer_table: bool = False,
    n: int = 24,
    seed: int = 0,
    layers: Sequence[int] | None = None,
    max_rows: int = MAX_ROWS,
    progress: Progress | None = None,
) -> PatchingResult:
    """Which heads carry a behaviour: patch each head's output from the corrupted run into the
    clean run, batched, on a model you hold.

    Args:
        model: a transformers causal LM (``AutoModelForCausalLM``), or a headlab
            :class:`~headlab.models.LoadedModel` loaded ``with_lm_head=True``.
        tokenizer: the model's tokenizer (not needed with a ``LoadedModel``).
        prompts: a built-in task name (``"ioi"``, ``"induction"``: ``n`` prompts drawn with
            ``seed``), a JSON Lines file, a list of :class:`Prompt` or of dicts with
            ``clean``, ``corrupt``, ``answer``, ``distractor``, or an encoded :class:`Task`.
        method: ``"activation"`` (exact), ``"attribution"`` or ``"ig"`` (gradient estimates).
        position: ``"all"`` (default), ``"last"``, or a token index.
        component: ``"z"`` query heads' outputs, or ``"k"``/``"v"`` per KV head.
        source: what replaces a head's output: ``"corrupt"`` (activation patching),
            ``"mean"`` or ``"resample"`` (ablation; ``method="activation"``, ``component="z"``).
        compare: with a gradient method, also run activation patching and correlate.
        layer_table: also patch each layer's residual stream, attention and MLP output.

    Example:
        >>> from transformers import AutoModelForCausalLM, AutoTokenizer  # doctest: +SKIP
        >>> result = patch_heads(model, tokenizer, "ioi", n=8)  # doctest: +SKIP
        >>> result.top(3)  # doctest: +SKIP
        [(23, 3, 0.41), ...]
    """

    lm = model if isinstance(model, Loaded) else _wrap(model, tokenizer)
    task = as_task(lm, prompts, n=n, seed=seed)
    return run_patching(
        lm,
        task,
        method=method,
        position=parse_position(position),
        component=component,
        source=source,
        steps=steps,
        compare=compare,
        layer_table=layer_table,
        layers=layers,
        max_rows=max_rows,
        progress=progress,
    )


def _wrap(model: Any, tokenizer: Any) -> LoadedModel:
    if tokenizer is None:
        raise InputError("patch_heads needs the model's tokenizer with a transformers model")
    # the folder it was loaded from by its model's name, never a cache's hashed folder (#59)
    name = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "")
    shown = display_name(Path(name)) if name and Path(name).is_dir() else name
    return wrap(model, tokenizer, name=shown or type(model).__name__)


def as_task(lm: LoadedModel, prompts: Any, *, n: int = 24, seed: int = 0) -> Task:
    """A :class:`Task` for ``lm``'s tokenizer from any form :func:`patch_heads` takes."""

    if isinstance(prompts, Task):
        return prompts
    if lm.tokenizer is None:
        raise InputError(f"{lm.name} has no tokenizer: patching reads text prompts")
    if isinstance(prompts, str) and prompts in BUILTIN:
        drawn = builtin_prompts(prompts, lm.tokenizer, n, seed=seed)
        return encode_task(lm.tokenizer, drawn, name=prompts)
    if isinstance(prompts, (str, Path)):
        path = Path(prompts)
        if path.suffix != ".jsonl" and not path.exists():
            raise InputError(
                f"unknown task {str(prompts)!r}: give {', '.join(BUILTIN)} or a .jsonl file"
            )
        return encode_task(lm.tokenizer, read_prompts(path), name=path.name)
    items = [p if isinstance(p, Prompt) else parse_prompt(p, f"prompt {i + 1}") for i, p in
             enumerate(prompts)]  # fmt: skip
    return encode_task(lm.tokenizer, items, name="prompts")
