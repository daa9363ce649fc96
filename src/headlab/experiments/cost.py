"""What several thin heads cost against one wide head, and heads one by one against all at once.

At a fixed model width ``E`` every head count ``H`` (with ``D = E / H``) has the same
parameters, ``4 E^2 + 4 E``, and the same matrix-product FLOPs; only the softmax's work grows
with ``H``. This module measures, for each head count and input length, on the chosen device:

* parameters, counted on the real modules (headlab's and torch's);
* FLOPs by part, from :func:`headlab.layout.costs.attention_flops` (the formulas of ``headlab spec``);
* time, forward and forward + backward, of :class:`~headlab.attention.MultiHeadAttention` on its
  fused path and with per-head weights kept, each against ``torch.nn.MultiheadAttention`` of the
  same width and heads with the same weights, and of a Python loop over heads (each head's own
  projections and attention, as the lesson's reference writes it) against the fused module;
* peak memory of each path's forward and forward + backward.

Timing: the paths run in blocks of calls, one path's block after another's, the order rotating
every round so that the shared machine's drift hits every path alike; a ratio is the median over
rounds of the ratio of two paths' blocks. Memory: on CUDA ``torch.cuda.max_memory_allocated``
during the call; on the CPU the bytes the allocator hands out, from ``torch.profiler`` with
``profile_memory=True`` (the peak of the running sum of the allocations and frees it records),
with headlab's huge-page tensors sent through the allocator for that call so that none escapes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from headlab.attention.blocks import attention_weights
from headlab.attention.memory import MEMORY_SHARE, available_bytes
from headlab.attention.module import MultiHeadAttention
from headlab.errors import ConfigError, InputError
from headlab.experiments.peak import MEMORY_METHOD, peak_bytes
from headlab.layout.attention import AttentionLayout
from headlab.layout.costs import attention_flops, compute_spec
from headlab.progress import Progress, stage
from headlab.text import human_bytes

#: the forward paths, in the order they are timed and shown
FORWARD_PATHS = ("torch", "fused", "torch_weights", "weights", "loop")
#: the forward + backward paths (the loop is a forward-only formulation)
BACKWARD_PATHS = ("torch", "fused", "torch_weights", "weights")

PATH_LABELS = {
    "torch": "torch.nn.MultiheadAttention, no weights",
    "fused": "headlab MultiHeadAttention, fused (no weights)",
    "torch_weights": "torch.nn.MultiheadAttention, per-head weights",
    "weights": "headlab MultiHeadAttention.inspect, per-head weights",
    "loop": "a Python loop over heads (the lesson's formulation)",
}


TIMING_METHOD = (
    "blocks of calls per path, alternating with a rotating order; times are medians of all "
    "calls, ratios the median over rounds of the ratio of two paths' block medians"
)


@dataclass(frozen=True, kw_only=True)
class CostOptions:
    """The experiment's grid and how hard to measure.

    Attributes:
        width: the model width ``E``.
        heads: head counts; each must divide ``width``.
        lengths: input lengths ``T`` (self-attention over ``T`` tokens, no mask).
        batch: sequences per call ``B``.
        device: ``"cpu"`` or ``"cuda"`` (or any torch device string).
        rounds: rounds of alternating blocks (at least 2); more rounds, steadier ratios.
        backward: also time forward + backward.
        seed: seed of the weights and inputs.
    """

    width: int = 768
    heads: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 32, 64)
    lengths: tuple[int, ...] = (512, 2048)
    batch: int = 1
    device: str = "cpu"
    rounds: int = 3
    backward: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("width", "batch", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name} must be a positive integer, got {value!r}")
        if self.rounds < 2:
            raise ConfigError(f"--rounds must be at least 2 (ratios need two), got {self.rounds}")
        if not self.heads or not self.lengths:
            raise ConfigError(
                f"--heads and --lengths must be non-empty, got {self.heads!r}, {self.lengths!r}"
            )
        for h in self.heads:
            if isinstance(h, bool) or not isinstance(h, int) or h < 1 or self.width % h:
                divisors = [d for d in range(1, min(self.width, 64) + 1) if self.width % d == 0]
                raise ConfigError(
                    f"--heads {h!r}: each head count must divide the width {self.width} "
                    f"(heads of equal width), e.g. {','.join(map(str, divisors))}"
                )
        for t in self.lengths:
            if isinstance(t, bool) or not isinstance(t, int) or t < 1:
                raise ConfigError(f"--lengths: each length must be a positive integer, got {t!r}")

    @classmethod
    def quick(cls, **overrides: Any) -> CostOptions:
        """A grid for a quick look (seconds on a laptop CPU): width 256, 1, 4 and 16 heads,
        256 tokens."""
        base: dict[str, Any] = {"width": 256, "heads": (1, 4, 16), "lengths": (256,)}
        base.update(overrides)
        return cls(**base)

    @classmethod
    def default_heads(cls, width: int) -> tuple[int, ...]:
        """The default head counts that divide ``width``."""
        return tuple(h for h in cls.heads if width % h == 0)


@dataclass(frozen=True, kw_only=True)
class CostRow:
    """One head count at one length: what it has, what it computes, what it took.

    Times are seconds (medians), memory bytes; ``None`` where not measured.
    """

    heads: int
    head_dim: int
    length: int
    params: dict[str, int]
    flops: dict[str, int]
    spec_flops: int
    weights_bytes: int
    forward_s: dict[str, float]
    forward_backward_s: dict[str, float | None]
    ratios: dict[str, float | None]
    ratio_spread: dict[str, list[float] | None]
    memory_forward: dict[str, int]
    memory_forward_backward: dict[str, int | None]
    #: largest |loop - fused| of the outputs: each head through its own slice of the output
    #: projection, summed, against the module (the concatenation, then the projection)
    loop_max_abs_diff: float | None = None


@dataclass(frozen=True, kw_only=True)
class CostResult:
    """The experiment's result: its options, how it measured, and one row per grid point."""

    options: CostOptions
    device: str
    memory_method: str
    timing_method: str
    rows: tuple[CostRow, ...]
    wall_s: float
    paths: dict[str, str] = field(default_factory=lambda: dict(PATH_LABELS))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``options``, ``device``, ``paths``, ``memory_method``,
        ``timing_method``, ``wall_s`` and ``rows`` (see :class:`CostRow` for their keys)."""
        options = asdict(self.options)
        options["heads"] = list(self.options.heads)
        options["lengths"] = list(self.options.lengths)
        return {
            "options": options,
            "device": self.device,
            "paths": dict(self.paths),
            "memory_method": self.memory_method,
            "timing_method": self.timing_method,
            "wall_s": round(self.wall_s, 2),
            "rows": [asdict(r) for r in self.rows],
        }


# ---------------------------------------------------------------------- the formulations
def loop_over_heads(module: MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """Self-attention of ``x`` ``(B, T, E)`` one head after another, each with its own slices of
    ``module``'s weights: its query, key and value projections, its scores, softmax and values'
    product, and its share of the output projection, summed (as
    :func:`headlab.attention.reference.reference_attention` writes it, in torch). Multi-head
    modules only (``n_kv_heads == n_heads``)."""
    if module.n_kv_heads != module.n_heads:
        raise ConfigError(
            f"loop_over_heads needs n_kv_heads == n_heads, got {module.n_kv_heads} and "
            f"{module.n_heads}"
        )
    h, d, e = module.n_heads, module.head_dim, module.d_model
    w, b = module.in_proj.weight, module.in_proj.bias  # ((3 H D), E), (3 H D,)
    w_o, b_o = module.out_proj.weight, module.out_proj.bias  # (E, H D), (E,)
    out = x.new_zeros(x.shape[0], x.shape[1], e)  # (B, T, E)
    for i in range(h):
        rows = [slice(part * h * d + i * d, part * h * d + (i + 1) * d) for part in range(3)]
        q, k, v = (
            F.linear(x, w[r], None if b is None else b[r])  # (B, T, D) each
            for r in rows
        )
        # the one engine's weights of this head alone: softmax(q k^T * scale)
        pattern = attention_weights(
            q[:, None], k[:, None], mask=None, causal=False, scaling=module.scale, dtype=q.dtype
        )[:, 0]  # (B, T, S)
        head = pattern.to(v.dtype) @ v  # (B, T, D)
        out = out + F.linear(head, w_o[:, i * d : (i + 1) * d])  # (B, T, E)
    return out if b_o is None else out + b_o


def _paths(
    ours: MultiHeadAttention, theirs: nn.MultiheadAttention, x: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """Forward calls of every path, to run under ``torch.inference_mode``."""

    def inspect() -> object:
        return ours.inspect(x, need_head_outputs=False, need_contributions=False).weights

    return {
        "torch": lambda: theirs(x, x, x, need_weights=False)[0],
        "fused": lambda: ours(x),
        "torch_weights": lambda: theirs(x, x, x, need_weights=True, average_attn_weights=False),
        "weights": inspect,
        "loop": lambda: loop_over_heads(ours, x),
    }


def _backward_paths(
    ours: MultiHeadAttention, theirs: nn.MultiheadAttention, x: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """Forward + backward calls (the loss sums the output, and the weights where kept)."""
    xg = x.detach().clone().requires_grad_(True)

    def torch_fb(weights: bool) -> None:
        out, w = theirs(xg, xg, xg, need_weights=weights, average_attn_weights=False)
        (out.sum() + (w.sum() if w is not None else 0)).backward()

    def ours_fb(weights: bool) -> None:
        r = ours.inspect(
            xg, need_weights=weights, need_head_outputs=False, need_contributions=False
        )
        (r.output.sum() + (r.weights.sum() if r.weights is not None else 0)).backward()

    return {
        "torch": lambda: torch_fb(False),
        "fused": lambda: ours_fb(False),
        "torch_weights": lambda: torch_fb(True),
        "weights": lambda: ours_fb(True),
    }


# ---------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@dataclass(frozen=True, kw_only=True)
class _Timed:
    seconds: dict[str, float]
    blocks: dict[str, list[float]]


def alternate(
    calls: dict[str, Callable[[], object]],
    *,
    rounds: int,
    once: float,
    sync: Callable[[], None] = lambda: None,
) -> _Timed:
    """Time ``calls`` in alternating blocks: each round runs every call's block, the order
    rotating by one each round; a block holds enough calls for about 0.2 s (1 to 5) given that
    one call takes about ``once`` seconds. Returns every call's median and its block medians."""
    names = list(calls)
    block = max(1, min(5, int(0.2 / max(once, 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in names}
    blocks: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn = calls[name]
            own = []
            for _ in range(block):
                start = time.perf_counter()
                fn()
                sync()
                own.append(time.perf_counter() - start)
            times[name] += own
            blocks[name].append(statistics.median(own))
    return _Timed(seconds={n: statistics.median(t) for n, t in times.items()}, blocks=blocks)


def _ratio(timed: _Timed, num: str, den: str) -> tuple[float, list[float]]:
    """Median of the per-round ratios ``num / den`` and their (min, max)."""
    ratios = [a / b for a, b in zip(timed.blocks[num], timed.blocks[den], strict=True)]
    return statistics.median(ratios), [min(ratios), max(ratios)]


def _warm_and_measure(
    calls: dict[str, Callable[[], object]], device: torch.device
) -> tuple[dict[str, int], float]:
    """One untimed call of each path (its warm-up) measures its peak memory; returns the peaks
    and the slowest of those calls' times (an upper bound, to size the timing blocks)."""
    peaks = {}
    slowest = 0.0
    for name, fn in calls.items():
        start = time.perf_counter()
        peaks[name] = peak_bytes(fn, device)
        slowest = max(slowest, time.perf_counter() - start)
    return peaks, slowest


def count_params(module: nn.Module) -> int:
    """Parameters of ``module``, counted on its tensors."""
    return sum(p.numel() for p in module.parameters())


def flops_by_part(width: int, heads: int, length: int, batch: int = 1) -> dict[str, int]:
    """FLOPs by part of ``batch`` self-attentions over ``length`` tokens at ``width`` and
    ``heads`` (see :func:`headlab.layout.costs.attention_flops`)."""
    d = width // heads
    parts = attention_flops(
        in_weights=3 * width * heads * d,
        out_weights=heads * d * width,
        n_heads=heads,
        qk_width=d,
        v_width=d,
        keys=length,
        queries=batch * length,
    )
    return parts.as_dict()


def spec_flops(width: int, heads: int, length: int, batch: int = 1) -> int:
    """What ``headlab spec`` says: its per-token attention FLOPs at context ``length`` for a
    one-layer layout of this width and heads, times the tokens."""
    layout = AttentionLayout(
        model_type="cost-experiment",
        n_layers=1,
        heads_per_layer=(heads,),
        kv_heads_per_layer=(heads,),
        head_dim=width // heads,
        d_model=width,
        layer_windows=(None,),
    )
    per_token = compute_spec(layout, context=length, dtype="fp32").attention_flops_per_token
    return batch * length * per_token


def measure_point(opts: CostOptions, heads: int, length: int, device: torch.device) -> CostRow:
    """Every number of one grid point."""
    torch.manual_seed(opts.seed)
    e = opts.width
    theirs = nn.MultiheadAttention(e, heads, batch_first=True, device=device).eval()
    ours = MultiHeadAttention.from_torch(theirs).eval()
    x = torch.randn(opts.batch, length, e, device=device)
    sync = _sync(device)

    with torch.inference_mode():
        calls = _paths(ours, theirs, x)
        mem_fwd, once = _warm_and_measure(calls, device)
        loop_diff = float((loop_over_heads(ours, x) - ours(x)).abs().max())
        fwd = alternate(calls, rounds=opts.rounds, once=once, sync=sync)
    ratios: dict[str, float | None] = {}
    spread: dict[str, list[float] | None] = {}
    for key, num, den in (
        ("fused_vs_torch", "fused", "torch"),
        ("weights_vs_torch", "weights", "torch_weights"),
        ("loop_vs_fused", "loop", "fused"),
    ):
        ratios[key], spread[key] = _ratio(fwd, num, den)

    fb_s: dict[str, float | None] = dict.fromkeys(BACKWARD_PATHS)
    mem_fb: dict[str, int | None] = dict.fromkeys(BACKWARD_PATHS)
    for key in ("fused_vs_torch_fb", "weights_vs_torch_fb"):
        ratios[key] = spread[key] = None
    if opts.backward:
        bcalls = _backward_paths(ours, theirs, x)
        peaks, once = _warm_and_measure(bcalls, device)
        fb = alternate(bcalls, rounds=opts.rounds, once=once, sync=sync)
        fb_s.update(fb.seconds)
        mem_fb.update(peaks)
        ratios["fused_vs_torch_fb"], spread["fused_vs_torch_fb"] = _ratio(fb, "fused", "torch")
        ratios["weights_vs_torch_fb"], spread["weights_vs_torch_fb"] = _ratio(
            fb, "weights", "torch_weights"
        )
    n_ours, n_theirs = count_params(ours), count_params(theirs)
    return CostRow(
        heads=heads,
        head_dim=e // heads,
        length=length,
        params={"headlab": n_ours, "torch": n_theirs, "loop": n_ours},
        flops=flops_by_part(e, heads, length, opts.batch),
        spec_flops=spec_flops(e, heads, length, opts.batch),
        weights_bytes=opts.batch * heads * length * length * x.element_size(),
        forward_s=fwd.seconds,
        forward_backward_s=fb_s,
        ratios=ratios,
        ratio_spread=spread,
        memory_forward=mem_fwd,
        loop_max_abs_diff=loop_diff,
        memory_forward_backward=mem_fb,
    )


#: bytes at the peak of the largest path, per float32 attention weight ``B H T T``: the
#: per-head-weights paths hold the weights beside the softmax's input (measured 1.2-1.4x on the
#: CPU at 256-512 tokens), 3.2-3.8x with the backward; rounded up
PEAK_PER_WEIGHT = {"forward": 2 * 4, "backward": 4 * 4}
#: float32 activations of width ``E`` per token alive beside them (input, q, k, v, output, grads)
ACTIVATIONS_PER_TOKEN = 32


def planned_peak(opts: CostOptions, heads: int, length: int) -> int:
    """The predicted peak bytes of grid point ``(heads, length)``'s largest path: ``B H T T``
    attention weights times :data:`PEAK_PER_WEIGHT`, the activations and both modules' weights
    (and their gradients with the backward). An upper bound: a test checks it against the
    measured peaks."""
    kind = "backward" if opts.backward else "forward"
    weights = opts.batch * heads * length * length * PEAK_PER_WEIGHT[kind]
    activations = ACTIVATIONS_PER_TOKEN * opts.batch * length * opts.width * 4
    parameters = 2 * (4 * opts.width * opts.width + 4 * opts.width) * 4  # headlab's and torch's
    return weights + activations + parameters * (2 if opts.backward else 1)


def longest_fitting(opts: CostOptions, heads: int, budget: int) -> int:
    """The longest length whose :func:`planned_peak` at ``heads`` fits ``budget`` bytes (0 when
    none does)."""
    lo, hi = 0, 1
    while planned_peak(opts, heads, hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if planned_peak(opts, heads, mid) <= budget else (lo, mid)
    return lo


def check_memory(opts: CostOptions, available: int | None) -> None:
    """Refuse, before anything is measured, a grid whose largest point's :func:`planned_peak`
    does not fit :data:`MEMORY_SHARE` of ``available`` bytes (``None``: not known, no check).

    Raises:
        InputError: one line naming the flag (``--lengths``, or ``--width`` when not even one
            token fits), the predicted peak, the memory available and the longest length that
            fits.
    """
    if available is None:
        return
    budget = int(MEMORY_SHARE * available)
    heads, length = max(opts.heads), max(opts.lengths)
    peak = planned_peak(opts, heads, length)
    if peak <= budget:
        return
    have = f"{human_bytes(available)} available here"
    fits = longest_fitting(opts, heads, budget)
    if fits == 0:
        raise InputError(
            f"--width {opts.width}: its weights and one token's activations alone would take "
            f"{human_bytes(planned_peak(opts, heads, 1))}, more than {MEMORY_SHARE:.0%} of the "
            f"{have}"
        )
    batch = f", --batch {opts.batch}" if opts.batch > 1 else ""
    raise InputError(
        f"--lengths {length}: {heads} heads{batch} at --width {opts.width} would take about "
        f"{human_bytes(peak)} at the peak (B x H x T x T attention weights"
        f"{', with the backward' if opts.backward else ''}), more than {MEMORY_SHARE:.0%} of the "
        f"{have}; the longest that fits is {fits:,} tokens"
    )


def run_cost(opts: CostOptions, *, progress: Progress | None = None) -> CostResult:
    """Measure every head count at every length (see the module's docstring); a grid that
    would not fit in memory is refused first (:func:`check_memory`)."""
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA device here")
    check_memory(opts, available_bytes(device))
    start = time.perf_counter()
    rows = []
    n_points = len(opts.lengths) * len(opts.heads)
    with stage(progress, "grid points", n_points, "points") as report:
        for length in opts.lengths:
            for heads in opts.heads:
                rows.append(measure_point(opts, heads, length, device))
                report.advance(note=f"{heads} head(s) of {opts.width // heads}, {length} tokens")
    return CostResult(
        options=opts,
        device=str(device),
        memory_method=MEMORY_METHOD["cuda" if device.type == "cuda" else "cpu"],
        timing_method=TIMING_METHOD,
        rows=tuple(rows),
        wall_s=time.perf_counter() - start,
    )


def rows_of(result: CostResult, length: int) -> Sequence[CostRow]:
    """The rows at one length, in head order."""
    return [r for r in result.rows if r.length == length]
