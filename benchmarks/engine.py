"""Compiled vs native vs plain torch for the block statistics and the per-head-weights forward.

Issue #20 keeps the hand-written C (``headlab.native``) only where, in the same run, it beats
the ``torch.compile``d engine by more than 1.2x. This script times, in one process:

* **block statistics** (one attention layer, block by block, as ``models/streaming.py``'s
  ``attention_blocks`` computes them for the role statistics: scores, right padding and the
  causal triangle, float32 softmax, each row's top weight and entropy, the weighted sums of 4
  per-key columns, the values' product): ``native`` (``headlab.attention.blocks.attention_blocks``
  with the kernels: ``native.attend_rows``), ``compiled`` (``compiled_engine.block_statistics``
  beside this script, over the same blocks) and ``torch`` (``attention_blocks`` without them);
* **per-head weights forward** of ``MultiHeadAttention.inspect`` at ``benchmarks/attention.py``'s
  shapes: ``torch`` (the module, all torch ops since its native path was removed) and
  ``compiled`` (the same projections around a ``torch.compile``d explicit attention).

Backends run in blocks of calls that alternate (their order rotating every round), so that the
shared machine's drift hits all alike; ratios are taken per round and their median and
interquartile range reported. Compile time (the first call, including any recompilation for a
second block shape) is reported apart.

    python benchmarks/engine.py [--rounds 12] [--block 3] [--only streaming|mha] [--flex]
        [--threads N]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from compiled_engine import block_statistics as compiled_block_statistics
from compiled_engine import reset as compiled_reset
from headlab import native
from headlab.attention import MultiHeadAttention
from headlab.attention import blocks as streaming

# name: (B, H, Hkv, D, T = S, causal); batches as benchmarks/roles.py packs 4,096 tokens
STREAMING = {
    "MiniLM T=128": (32, 12, 12, 32, 128, False),
    "MiniLM T=512": (8, 12, 12, 32, 512, False),
    "GQA-100M S=512": (8, 12, 4, 64, 512, True),
    "GQA-100M S=2048": (2, 12, 4, 64, 2048, True),
}
MHA_SHAPES = [(8, 128, 384, 12), (1, 1024, 768, 12), (4, 512, 1024, 16)]
N_COLUMNS = 4


class NoNative:
    """Inside: ``headlab.native`` reports no kernels (the torch path of every caller)."""

    def __enter__(self) -> None:
        self._saved = native.kernels
        native.kernels = lambda: None  # type: ignore[assignment]

    def __exit__(self, *exc: object) -> None:
        native.kernels = self._saved  # type: ignore[assignment]


def compare(fns: dict[str, Callable[[], object]], rounds: int, block: int) -> dict[str, object]:
    """Median seconds per call of each function, and per round the ratio of each to the first
    (``ratio[name]``: median and interquartile range over rounds)."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        medians = {}
        for n in order:
            fns[n]()  # untimed: the previous backend's memory state
            own = []
            for _ in range(block):
                start = time.perf_counter()
                fns[n]()
                own.append(time.perf_counter() - start)
            times[n] += own
            medians[n] = statistics.median(own)
        for n in names[1:]:
            ratios[n].append(medians[n] / medians[names[0]])
    out: dict[str, object] = {n: statistics.median(times[n]) for n in names}
    for n, values in ratios.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        out[f"ratio {n}"] = (statistics.median(values), q1, q3)
    return out


def streaming_inputs(
    n_batch: int, n_heads: int, n_kv: int, d: int, n: int
) -> tuple[torch.Tensor, ...]:
    """A model's head views (token-major), right padding, 4 per-key columns."""
    g = torch.Generator().manual_seed(n + d)
    query = torch.randn(n_batch, n, n_heads, d, generator=g).transpose(1, 2)  # (B, H, T, D)
    key = torch.randn(n_batch, n, n_kv, d, generator=g).transpose(1, 2)  # (B, Hkv, S, D)
    value = torch.randn(n_batch, n, n_kv, d, generator=g).transpose(1, 2)
    lengths = torch.tensor([n - (7 * b) % (n // 3) for b in range(n_batch)])  # (B,)
    columns = torch.rand(n_batch, n, N_COLUMNS, generator=g)  # (B, S, X)
    return query, key, value, lengths, columns


def streaming_layer(shape: tuple[int, ...], compiled: bool) -> Callable[[], object]:
    """One layer of block statistics: through ``attention_blocks`` (native or torch, as the
    caller arranges), or the same blocks through the compiled function."""
    n_batch, n_heads, n_kv, d, n, causal = shape
    query, key, value, lengths, columns = streaming_inputs(n_batch, n_heads, n_kv, d, n)
    scale = d**-0.5
    rows = streaming.block_rows(n_batch, n_heads, n, 1 << 20)

    def on_block(start: int, weights: torch.Tensor, *rest: object) -> None:
        # read the block as a consumer would, keeping nothing (a kept view would keep the
        # whole block's tensor alive)
        float(weights[0, 0, 0, 0])

    workspace = streaming.Workspace()
    if not compiled:
        return lambda: streaming.attention_blocks(
            query, key, value, mask=None, causal=bool(causal), scaling=scale, on_block=on_block,
            columns=columns, workspace=workspace, lengths=[int(x) for x in lengths],
        )  # fmt: skip
    keys, values = key.contiguous(), value.contiguous()  # (B, Hkv, S, D) head after head

    def run() -> torch.Tensor:
        out = query.new_empty(n_batch, n, n_heads, d)  # (B, T, H, D)
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            seen = stop if causal else n
            positions = torch.arange(start, stop) if causal else torch.full((stop - start,), n)
            stats = compiled_block_statistics(
                query[:, :, start:stop], keys[:, :, :seen], values[:, :, :seen], scale=scale,
                rows=positions, lengths=lengths, columns=columns[:, :seen],
            )  # fmt: skip
            on_block(start, stats.weights, stats.entropy, stats.top, stats.mixed)
            out[:, start:stop] = stats.product.transpose(1, 2)
        return out

    return run


def check_streaming(shape: tuple[int, ...]) -> float:
    """Largest difference of the compiled layer's output from the torch one's."""
    with NoNative():
        expect = streaming_layer(shape, compiled=False)()
    got = streaming_layer(shape, compiled=True)()
    assert isinstance(expect, torch.Tensor) and isinstance(got, torch.Tensor)
    return float((expect - got).abs().max())


def bench_streaming(rounds: int, block: int) -> None:
    print("\n## block statistics (one layer, all blocks; ms per layer)\n")
    print("| shape | B,H,Hkv,D,T | compile s | native | compiled | torch "
          "| native/compiled (IQR) | torch/compiled (IQR) | max diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for name, shape in STREAMING.items():
        streaming_row(name, shape, rounds, block)


def streaming_row(name: str, shape: tuple[int, ...], rounds: int, block: int) -> None:
    torch._dynamo.reset()
    compiled_reset()
    run_compiled = streaming_layer(shape, compiled=True)
    start = time.perf_counter()
    with torch.inference_mode():
        run_compiled()
    compile_s = time.perf_counter() - start
    run_native = streaming_layer(shape, compiled=False)
    run_torch = streaming_layer(shape, compiled=False)

    def plain() -> object:
        with NoNative():
            return run_torch()

    with torch.inference_mode():
        diff = check_streaming(shape)
        res = compare(
            {"compiled": run_compiled, "native": run_native, "torch": plain}, rounds, block
        )
    rn, rt = res["ratio native"], res["ratio torch"]
    assert isinstance(rn, tuple) and isinstance(rt, tuple)
    n_batch, n_heads, n_kv, d, n, _ = shape
    ms = {k: 1e3 * float(res[k]) for k in ("native", "compiled", "torch")}  # type: ignore[arg-type]
    print(
        f"| {name} | {n_batch},{n_heads},{n_kv},{d},{n} | {compile_s:.1f} "
        f"| {ms['native']:.2f} | {ms['compiled']:.2f} | {ms['torch']:.2f} "
        f"| {rn[0]:.2f} ({rn[1]:.2f}-{rn[2]:.2f}) | {rt[0]:.2f} ({rt[1]:.2f}-{rt[2]:.2f}) "
        f"| {diff:.1e} |",
        flush=True,
    )


def _explicit(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * scale, dim=-1)  # (B,H,T,S)
    return weights, torch.matmul(weights, v)  # (B, H, T, D)


def mha_compiled(ours: MultiHeadAttention) -> Callable[[torch.Tensor], object]:
    """``inspect``'s per-head-weights forward with a compiled explicit attention."""
    attend = torch.compile(_explicit, dynamic=False, fullgraph=True)
    h, d = ours.n_heads, ours.head_dim

    def forward(x: torch.Tensor) -> object:
        b, t, _ = x.shape
        qkv = F.linear(x, ours.in_proj.weight, ours.in_proj.bias)  # (B, T, 3 H D)
        q, k, v = qkv.view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        weights, heads = attend(q, k, v, ours.scale)
        out = ours.out_proj(heads.transpose(1, 2).reshape(b, t, h * d))  # (B, T, E)
        return out, weights

    return forward


def bench_mha(rounds: int, block: int) -> None:
    print("\n## per-head weights forward (MultiHeadAttention.inspect; ms per call)\n")
    print("| B,T,E,H | compile s | compiled | torch | torch/compiled (IQR) | max diff |")
    print("|---|---|---|---|---|---|")
    for b, t, e, h in MHA_SHAPES:
        mha_row(b, t, e, h, rounds, block)


def mha_row(b: int, t: int, e: int, h: int, rounds: int, block: int) -> None:
    torch.manual_seed(0)
    ours = MultiHeadAttention(d_model=e, n_heads=h).eval()
    x = torch.randn(b, t, e)
    forward = mha_compiled(ours)

    def run_compiled() -> object:
        return forward(x)

    def run_torch() -> object:
        return ours.inspect(x, need_head_outputs=False, need_contributions=False)

    with torch.inference_mode():
        start = time.perf_counter()
        got = run_compiled()
        compile_s = time.perf_counter() - start
        expect = run_torch()
        assert isinstance(got, tuple)
        diff = float((got[1] - expect.weights).abs().max())  # type: ignore[attr-defined]
        res = compare({"compiled": run_compiled, "torch": run_torch}, rounds, block)
    rt = res["ratio torch"]
    assert isinstance(rt, tuple)
    ms = {k: 1e3 * float(res[k]) for k in ("compiled", "torch")}  # type: ignore[arg-type]
    print(
        f"| {b},{t},{e},{h} | {compile_s:.1f} | {ms['compiled']:.2f} | {ms['torch']:.2f} "
        f"| {rt[0]:.2f} ({rt[1]:.2f}-{rt[2]:.2f}) | {diff:.1e} |",
        flush=True,
    )


def check_flex() -> None:
    """Whether FlexAttention runs here and returns the rows' logsumexp (from which a block's
    weights are ``exp(scale q k^T - lse)``), and how long it takes against sdpa."""
    print("\n## FlexAttention\n")
    try:
        from torch.nn.attention.flex_attention import flex_attention

        q = torch.randn(8, 12, 512, 32)
        flex = torch.compile(flex_attention, dynamic=False)
        start = time.perf_counter()
        out, lse = flex(q, q, q, return_lse=True)  # type: ignore[arg-type]
        compile_s = time.perf_counter() - start
        ref = F.scaled_dot_product_attention(q, q, q)
        weights = torch.exp(q @ q.transpose(-2, -1) * 32**-0.5 - lse[..., None])
        res = compare(
            {"sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
             "flex": lambda: flex(q, q, q, return_lse=True)},  # type: ignore[arg-type]
            6, 3,
        )  # fmt: skip
        r = res["ratio flex"]
        assert isinstance(r, tuple)
        print(
            f"flex_attention with return_lse on CPU: compile {compile_s:.1f} s, output vs sdpa "
            f"{float((out - ref).abs().max()):.1e}, weights from lse sum to 1 within "
            f"{float((weights.sum(-1) - 1).abs().max()):.1e}; flex/sdpa time {r[0]:.2f} "
            f"({r[1]:.2f}-{r[2]:.2f}) at (8, 12, 512, 32)"
        )
    except Exception as err:  # report, do not fail the benchmark
        print(f"flex_attention unavailable here: {type(err).__name__}: {err}".splitlines()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--only", choices=["streaming", "mha"])
    parser.add_argument("--flex", action="store_true")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lib = native.kernels()
    print(
        f"{platform.processor() or platform.machine()} | torch {torch.__version__} | "
        f"{torch.get_num_threads()} threads | native: "
        f"{'AVX-512' if native.fused_scores() else 'portable' if lib else native.why_not()} | "
        f"rounds {args.rounds} x {args.block} calls"
    )
    if args.only in (None, "streaming"):
        bench_streaming(args.rounds, args.block)
    if args.only in (None, "mha"):
        bench_mha(args.rounds, args.block)
    if args.flex:
        check_flex()


if __name__ == "__main__":
    main()
