"""Activation patching and its gradient estimates, against loops written with plain hooks.

The oracle never touches headlab's patching classes: it finds each layer's output projection
by name in the Hugging Face model, records the corrupted run's input to it, and runs one
forward pass per head and prompt with that head's slice swapped in (eager attention, float64).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.conftest import needs_smollm2
from tests.models.tiny import build

from headlab.causal.patching import (
    activation_patching,
    attribution_patching,
    logit_difference,
    pearson,
    run_patching,
    spearman,
)
from headlab.causal.tasks import Batch, Prompt, Task, encode_task
from headlab.errors import InputError
from headlab.models.loading import LoadedModel, load


def _out_projs(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each layer's output projection, found by the family's own names."""
    if hasattr(model, "transformer"):  # GPT-2
        return [block.attn.c_proj for block in model.transformer.h]
    return [layer.self_attn.o_proj for layer in model.model.layers]


def _ld(model: torch.nn.Module, ids: torch.Tensor, answer: int, distractor: int) -> float:
    logits = model(input_ids=ids).logits[0, -1]
    return float(logits[answer] - logits[distractor])


def _record(model: torch.nn.Module, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every output projection's input ``(1, T, H*D)`` in a forward pass over ``ids``."""
    seen: list[torch.Tensor] = []
    hooks = [
        p.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
        for p in _out_projs(model)
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _oracle_patching(
    model: torch.nn.Module,
    prompts: list[tuple[list[int], list[int], int, int]],
    n_heads: int,
    position: int | None = None,
) -> tuple[torch.Tensor, float, float]:
    """``(L, H)`` normalized effects, one forward pass per head and prompt."""
    projs = _out_projs(model)
    patched = torch.zeros(len(projs), n_heads, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for clean, corrupt, answer, distractor in prompts:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        source = _record(model, x_ids)
        with torch.no_grad():
            clean_sum += _ld(model, c_ids, answer, distractor)
            corrupt_sum += _ld(model, x_ids, answer, distractor)
        for layer, proj in enumerate(projs):
            width = source[layer].shape[-1] // n_heads
            for head in range(n_heads):
                cols = slice(head * width, (head + 1) * width)
                rows = slice(None) if position is None else slice(position, position + 1)
                if position == -1:
                    rows = slice(-1, None)

                def swap(m, a, layer=layer, cols=cols, rows=rows):
                    x = a[0].clone()
                    x[:, rows, cols] = source[layer][:, rows, cols]  # noqa: B023
                    return (x,)

                hook = proj.register_forward_pre_hook(swap)
                try:
                    with torch.no_grad():
                        patched[layer, head] += _ld(model, c_ids, answer, distractor)
                finally:
                    hook.remove()
    n = len(prompts)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    return (clean - patched / n) / (clean - corrupt), clean, corrupt


def _random_task(lm: LoadedModel, n: int, length: int, seed: int) -> tuple[Task, list]:
    """Prompts of random tokens, corrupted at two positions; answer/distractor two fixed ids."""
    g = torch.Generator().manual_seed(seed)
    raw = []
    for _ in range(n):
        clean = torch.randint(1000, 5000, (length,), generator=g).tolist()
        corrupt = list(clean)
        for pos in (1, length - 3):
            corrupt[pos] = int(torch.randint(5000, 9000, (1,), generator=g))
        raw.append((clean, corrupt, 2000 + len(raw), 3000))
    batch = Batch(
        clean=torch.tensor([r[0] for r in raw]),
        corrupt=torch.tensor([r[1] for r in raw]),
        answer=torch.tensor([r[2] for r in raw]),
        distractor=torch.tensor([r[3] for r in raw]),
        index=tuple(range(n)),
    )
    prompts = tuple(Prompt(clean="", corrupt="", answer="", distractor="") for _ in raw)
    return Task(name="random", prompts=prompts, batches=(batch,)), raw


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = build(
        request.param,
        tmp_path_factory.mktemp(request.param),
        lm_head=True,
        attn_implementation="eager",
        seed=3,
    )
    lm = load(folder, with_lm_head=True)
    lm.model.double()
    return lm


@pytest.mark.parametrize("position", [None, -1, 4])
def test_activation_patching_matches_a_loop_per_head_and_prompt(tiny, position):
    task, raw = _random_task(tiny, 3, 9, seed=1)
    n_heads = tiny.layout.heads_per_layer[0]
    expected, clean, corrupt = _oracle_patching(tiny.model, raw, n_heads, position)
    # max_rows small: the heads of a layer go through in several passes
    got = activation_patching(tiny, task, position=position, max_rows=6)
    assert got.clean == pytest.approx(clean, abs=1e-10)
    assert got.corrupt == pytest.approx(corrupt, abs=1e-10)
    torch.testing.assert_close(got.effects, expected, atol=1e-9, rtol=1e-9)
    heads = got.to_json()["heads"]
    assert len(heads) == tiny.n_layers * n_heads
    assert {(h["layer"], h["head"]) for h in heads} == {
        (layer, head) for layer in range(tiny.n_layers) for head in range(n_heads)
    }


def test_one_layer_only_leaves_the_others_unmeasured(tiny):
    task, _raw = _random_task(tiny, 2, 7, seed=2)
    full = activation_patching(tiny, task)
    one = activation_patching(tiny, task, layers=[1])
    assert one.effects[0].isnan().all()
    torch.testing.assert_close(one.effects[1], full.effects[1], atol=1e-10, rtol=0)
    assert {h["layer"] for h in one.to_json()["heads"]} == {1}
    with pytest.raises(InputError, match=r"layers must be in 0\.\.1"):
        activation_patching(tiny, task, layers=[2])


def test_attribution_is_the_first_order_term_of_the_patch(tiny):
    """The estimate equals the directional derivative of the metric, measured by finite
    differences along (z_corrupt - z_clean) of each head, without autograd."""
    task, raw = _random_task(tiny, 2, 8, seed=4)
    got = attribution_patching(tiny, task)
    n_heads = tiny.layout.heads_per_layer[0]
    projs = _out_projs(tiny.model)
    # central differences, error O(eps^2); not smaller: Llama's RMSNorm and rotary run in
    # float32 even in a float64 model, and that rounding over eps would swamp the slope
    eps = 1e-2
    clean_sum = corrupt_sum = 0.0
    slope = torch.zeros(len(projs), n_heads, dtype=torch.float64)
    for clean, corrupt, answer, distractor in raw:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        src, base = _record(tiny.model, x_ids), _record(tiny.model, c_ids)
        with torch.no_grad():
            clean_sum += _ld(tiny.model, c_ids, answer, distractor)
            corrupt_sum += _ld(tiny.model, x_ids, answer, distractor)
        for layer, proj in enumerate(projs):
            width = src[layer].shape[-1] // n_heads
            for head in range(n_heads):
                cols = slice(head * width, (head + 1) * width)

                def nudged(step: float, layer=layer, cols=cols, proj=proj) -> float:
                    def nudge(m, a):
                        x = a[0].clone()
                        x[..., cols] += step * (src[layer] - base[layer])[..., cols]  # noqa: B023
                        return (x,)

                    hook = proj.register_forward_pre_hook(nudge)
                    try:
                        with torch.no_grad():
                            return _ld(tiny.model, c_ids, answer, distractor)  # noqa: B023
                    finally:
                        hook.remove()

                slope[layer, head] += (nudged(eps) - nudged(-eps)) / (2 * eps)
    n = len(raw)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    expected = (-slope / n) / (clean - corrupt)
    torch.testing.assert_close(got.effects, expected, atol=1e-4, rtol=1e-3)


def test_integrated_gradients_average_the_gradient_along_the_path(tiny):
    task, raw = _random_task(tiny, 2, 8, seed=5)
    plain = attribution_patching(tiny, task)
    one_step = attribution_patching(tiny, task, method="ig", steps=1)
    # one point of a right Riemann sum is the clean input itself
    torch.testing.assert_close(one_step.effects, plain.effects, atol=1e-10, rtol=0)
    # three points, against a loop that interpolates the embeddings with its own hook
    steps = 3
    got = attribution_patching(tiny, task, method="ig", steps=steps)
    embed = tiny.model.get_input_embeddings()
    projs = _out_projs(tiny.model)
    n_heads = tiny.layout.heads_per_layer[0]
    total = torch.zeros(len(projs), n_heads, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for clean, corrupt, answer, distractor in raw:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        src, base = _record(tiny.model, x_ids), _record(tiny.model, c_ids)
        with torch.no_grad():
            clean_sum += _ld(tiny.model, c_ids, answer, distractor)
            corrupt_sum += _ld(tiny.model, x_ids, answer, distractor)
            e_clean, e_corrupt = embed(c_ids), embed(x_ids)
        grads = [torch.zeros_like(b) for b in base]
        for k in range(1, steps + 1):
            alpha = k / steps
            kept: list[torch.Tensor] = []

            def keep(m, a):
                # a view that stays on the graph: later layers still see earlier heads
                x = a[0]
                view = x.view(x.shape)
                view.retain_grad()
                kept.append(view)  # noqa: B023
                return (view,)

            hooks = [p.register_forward_pre_hook(keep) for p in projs]
            hooks.append(
                embed.register_forward_hook(
                    lambda m, a, out: e_corrupt + alpha * (e_clean - e_corrupt)  # noqa: B023
                )
            )
            try:
                logits = tiny.model(input_ids=c_ids).logits[0, -1]
                g = torch.autograd.grad(logits[answer] - logits[distractor], kept)
            finally:
                for h in hooks:
                    h.remove()
            for layer in range(len(projs)):
                grads[layer] += g[layer] / steps
        for layer in range(len(projs)):
            terms = ((base[layer] - src[layer]) * grads[layer]).view(
                1, -1, n_heads, grads[layer].shape[-1] // n_heads
            )
            total[layer] += terms.sum(dim=(0, 1, 3))
    n = len(raw)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    expected = (total / n) / (clean - corrupt)
    torch.testing.assert_close(got.effects, expected, atol=1e-9, rtol=1e-9)


def test_a_task_without_a_gap_is_refused(tiny):
    task, _ = _random_task(tiny, 2, 6, seed=6)
    same = Task(
        name="same",
        prompts=task.prompts,
        batches=tuple(
            Batch(
                clean=b.clean,
                corrupt=b.clean,
                answer=b.answer,
                distractor=b.distractor,
                index=b.index,
            )
            for b in task.batches
        ),
    )
    with pytest.raises(InputError, match="no gap"):
        activation_patching(tiny, same)
    with pytest.raises(InputError, match="position 9 is outside a prompt of 6 tokens"):
        activation_patching(tiny, task, position=9)
    with pytest.raises(InputError, match="method must be one of"):
        run_patching(tiny, task, method="magic")


def test_a_model_without_its_head_is_refused(tmp_path):
    lm = load(build("llama", tmp_path / "m"))
    task, _ = _random_task(lm, 1, 5, seed=0)
    with pytest.raises(InputError, match="language-model head"):
        activation_patching(lm, task)


def test_logit_difference_reads_the_two_ids():
    logits = torch.tensor([[0.0, 1.0, 5.0], [2.0, -1.0, 0.5]])
    got = logit_difference(logits, torch.tensor([2, 0]), torch.tensor([1, 1]))
    assert got.tolist() == [4.0, 3.0]
    assert pearson(
        torch.tensor([[1.0, 2.0], [3.0, float("nan")]]), torch.tensor([[2.0, 4.0], [6.0, 0.0]])
    ) == pytest.approx(1.0)


# ---------------------------------------------------------------------------- SmolLM2 and IOI
@pytest.fixture(scope="module")
def smollm2(smollm2_folder: Path) -> LoadedModel:
    return load(smollm2_folder, with_lm_head=True)


def _ioi(lm: LoadedModel, n: int) -> list[Prompt]:
    from headlab.causal.generators import ioi

    return ioi(lm.tokenizer, n, seed=7)


@needs_smollm2
def test_smollm2_patching_matches_the_loop_on_ioi(smollm2):
    prompts = _ioi(smollm2, 3)
    task = encode_task(smollm2.tokenizer, prompts, name="ioi")
    raw = []
    for b in task.batches:
        for i in range(b.clean.shape[0]):
            raw.append(
                (b.clean[i].tolist(), b.corrupt[i].tolist(), int(b.answer[i]), int(b.distractor[i]))
            )
    layers = [0, 23, 29]
    got = activation_patching(smollm2, task, layers=layers)
    n_heads = smollm2.layout.heads_per_layer[0]
    projs = _out_projs(smollm2.model)
    # the oracle on the chosen layers only
    keep = [projs[layer] for layer in layers]
    expected = torch.zeros(len(layers), n_heads, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for clean, corrupt, answer, distractor in raw:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        src = _record(smollm2.model, x_ids)
        with torch.no_grad():
            clean_sum += _ld(smollm2.model, c_ids, answer, distractor)
            corrupt_sum += _ld(smollm2.model, x_ids, answer, distractor)
        for j, (layer, proj) in enumerate(zip(layers, keep, strict=True)):
            width = src[layer].shape[-1] // n_heads
            for head in range(n_heads):
                cols = slice(head * width, (head + 1) * width)

                def swap(m, a, layer=layer, cols=cols):
                    x = a[0].clone()
                    x[..., cols] = src[layer][..., cols]  # noqa: B023
                    return (x,)

                hook = proj.register_forward_pre_hook(swap)
                try:
                    with torch.no_grad():
                        expected[j, head] += _ld(smollm2.model, c_ids, answer, distractor)
                finally:
                    hook.remove()
    n = len(raw)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    expected = (clean - expected / n) / (clean - corrupt)
    assert clean > corrupt + 1.0  # the model does IOI: the gap is there to explain
    torch.testing.assert_close(got.effects[layers], expected, atol=2e-4, rtol=1e-3)
    assert spearman(got.effects[layers], expected) >= 0.95
    ours = torch.topk(got.effects[layers].flatten().abs(), 3).indices.tolist()
    assert ours == torch.topk(expected.flatten().abs(), 3).indices.tolist()
    # the gradient estimate ranks the same top head of these layers
    estimate = attribution_patching(smollm2, task)
    top_exact = divmod(int(got.effects[layers].abs().argmax()), n_heads)
    top_estimate = divmod(int(estimate.effects[layers].abs().argmax()), n_heads)
    assert top_exact == top_estimate


# ----------------------------------------------------- keys, values and whole layers (oracles)
def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    if hasattr(model, "transformer"):  # GPT-2
        return list(model.transformer.h)
    return list(model.model.layers)


def _kv_module(model: torch.nn.Module, layer: int, component: str) -> tuple[torch.nn.Module, int]:
    """The module that outputs ``layer``'s keys or values, and their first column."""
    block = _blocks(model)[layer]
    if hasattr(block, "attn"):  # GPT-2's c_attn: [q | k | v], each of the model's width
        width = model.config.n_embd
        return block.attn.c_attn, width if component == "k" else 2 * width
    attn = block.self_attn
    return (attn.k_proj if component == "k" else attn.v_proj), 0


def _oracle_swap_outputs(
    model: torch.nn.Module,
    raw: list,
    modules: list[torch.nn.Module],
    columns: list[slice | None],
    kind: str = "output",
) -> tuple[torch.Tensor, float, float]:
    """Normalized effects ``(len(modules),)``: the clean run with ``module``'s output (or, for
    ``kind="input"``, its hidden-states input) columns taken from the corrupted run; one
    forward per module and prompt."""
    patched = torch.zeros(len(modules), dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for clean, corrupt, answer, distractor in raw:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        seen: dict[int, torch.Tensor] = {}
        hooks = []
        for i, m in enumerate(modules):
            if kind == "input":
                hooks.append(
                    m.register_forward_pre_hook(
                        lambda mod, a, kw, i=i: seen.__setitem__(  # noqa: B023
                            i, (a[0] if a else kw["hidden_states"]).clone()
                        ),
                        with_kwargs=True,
                    )
                )
            else:
                hooks.append(
                    m.register_forward_hook(
                        lambda mod, a, out, i=i: seen.__setitem__(  # noqa: B023
                            i, (out[0] if isinstance(out, tuple) else out).clone()
                        )
                    )
                )
        with torch.no_grad():
            corrupt_sum += _ld(model, x_ids, answer, distractor)
        for h in hooks:
            h.remove()
        with torch.no_grad():
            clean_sum += _ld(model, c_ids, answer, distractor)
        for i, m in enumerate(modules):
            cols = columns[i] or slice(None)

            if kind == "input":

                def pre(mod, a, kw, i=i):
                    if a:
                        return (seen[i], *a[1:]), kw  # noqa: B023
                    return a, {**kw, "hidden_states": seen[i]}  # noqa: B023

                hook = m.register_forward_pre_hook(pre, with_kwargs=True)
            else:

                def post(mod, a, out, i=i, cols=cols):
                    first = out[0] if isinstance(out, tuple) else out
                    first = first.clone()
                    first[..., cols] = seen[i][..., cols]  # noqa: B023
                    return (first, *out[1:]) if isinstance(out, tuple) else first

                hook = m.register_forward_hook(post)
            try:
                with torch.no_grad():
                    patched[i] += _ld(model, c_ids, answer, distractor)
            finally:
                hook.remove()
    n = len(raw)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    return (clean - patched / n) / (clean - corrupt), clean, corrupt


@pytest.mark.parametrize("component", ["k", "v"])
def test_keys_and_values_are_patched_per_kv_head(tiny, component):
    task, raw = _random_task(tiny, 3, 8, seed=8)
    got = activation_patching(tiny, task, component=component, max_rows=4)
    n_kv, d = tiny.layout.kv_heads_per_layer[0], tiny.head_dim
    modules, columns = [], []
    for layer in range(tiny.n_layers):
        module, first = _kv_module(tiny.model, layer, component)
        for g in range(n_kv):
            modules.append(module)
            columns.append(slice(first + g * d, first + (g + 1) * d))
    expected, _, _ = _oracle_swap_outputs(tiny.model, raw, modules, columns)
    torch.testing.assert_close(got.effects[:, :n_kv].flatten(), expected, atol=1e-9, rtol=1e-9)
    assert got.effects[:, n_kv:].isnan().all()  # only KV heads are units here
    out = got.to_json()
    assert out["component"] == component and len(out["kv_heads"]) == tiny.n_layers * n_kv
    assert "heads" not in out and {"layer", "kv_head", "effect"} <= set(out["kv_heads"][0])
    assert (expected.abs() > 1e-6).any()  # the patches change something


@pytest.mark.parametrize("position", [None, -1])
def test_layer_table_matches_hooks_on_blocks_attention_and_mlp(tiny, position):
    from headlab.causal.patching import layer_patching

    task, raw = _random_task(tiny, 2, 8, seed=9)
    got = layer_patching(tiny, task, position=position)
    blocks = _blocks(tiny.model)
    attns = [getattr(b, "attn", None) or b.self_attn for b in blocks]
    mlps = [b.mlp for b in blocks]
    if position is None:
        resid, _, _ = _oracle_swap_outputs(tiny.model, raw, blocks, [None] * len(blocks), "input")
        attn, _, _ = _oracle_swap_outputs(tiny.model, raw, attns, [None] * len(attns))
        mlp, _, _ = _oracle_swap_outputs(tiny.model, raw, mlps, [None] * len(mlps))
        torch.testing.assert_close(got.resid, resid, atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(got.attn, attn, atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(got.mlp, mlp, atol=1e-9, rtol=1e-9)
        # the residual stream into layer 0 is the whole corrupted input: the full gap
        assert float(got.resid[0]) == pytest.approx(1.0, abs=1e-9)
    else:  # the last position's attention output equals patching its heads all at once
        heads_all = activation_patching(tiny, task, position=position)
        assert heads_all.component == "z"
        assert got.attn.shape == (tiny.n_layers,) and not got.attn.isnan().any()
    rows = got.to_json()
    assert [r["layer"] for r in rows] == list(range(tiny.n_layers))


def test_the_last_position_runs_the_last_token_alone(tiny, monkeypatch):
    """Patching the last token leaves every earlier position as in the clean run, so only the
    last token runs the layers above the patch (over the clean keys and values); the result
    is the full run's."""
    import headlab.causal.activation as patching

    task, _ = _random_task(tiny, 3, 9, seed=11)
    full = {}
    monkeypatch.setattr(patching, "_prefix_cache", lambda lm, batch: None)
    full["z"] = activation_patching(tiny, task, position=-1).effects
    full["k"] = activation_patching(tiny, task, position=-1, component="k").effects
    monkeypatch.undo()
    calls = []
    real = patching._last_token_ld
    monkeypatch.setattr(
        patching, "_last_token_ld", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    for component in ("z", "k"):
        fast = activation_patching(tiny, task, position=-1, component=component).effects
        torch.testing.assert_close(fast, full[component], atol=1e-10, rtol=1e-10, equal_nan=True)
    assert len(calls) >= 2 * tiny.n_layers


def test_the_runs_seconds_count_the_layer_stage(tiny, monkeypatch):
    """``headlab patch``'s "in N s" and the JSON's ``seconds`` cover the whole run, the layer
    table's stage included (it took 27-91 s of SmolLM2's runs and was left out)."""
    import time

    from headlab.causal import patching

    real = patching.layer_patching

    def slow(*args, **kwargs):
        time.sleep(0.5)  # a known half second on top of the real stage
        return real(*args, **kwargs)

    monkeypatch.setattr(patching, "layer_patching", slow)
    task, _ = _random_task(tiny, 2, 8, seed=9)
    without = patching.run_patching(tiny, task)
    with_layers = patching.run_patching(tiny, task, layer_table=True)
    assert with_layers.layers is not None
    assert with_layers.seconds >= 0.5 and with_layers.seconds > without.seconds


class _Stages:
    def __init__(self) -> None:
        self.stages: list[list] = []

    def start(self, name: str, total: int | None = None, unit: str = "items") -> None:
        self.stages.append([name, total, unit, 0])

    def advance(self, n: int = 1, *, note: str | None = None) -> None:
        self.stages[-1][3] += n

    def end(self) -> None:
        pass


def test_progress_counts_what_it_names(tiny: LoadedModel) -> None:
    """#59: with two batches of prompts the bar counts head passes and says so, instead of
    calling twice the heads "heads"; one batch counts heads; path patching of one sender
    says "sender"."""
    from headlab.causal.paths import parse_receiver, path_patching

    one, _ = _random_task(tiny, 3, 9, seed=1)
    two = Task(name="two", prompts=one.prompts * 2, batches=one.batches * 2)
    heads = sum(tiny.layout.heads_per_layer)
    for task, label, total, unit in (
        (one, "patching heads", heads, "heads"),
        (two, f"patching heads ({heads} heads x 2 batches)", 2 * heads, "passes"),
    ):
        seen = _Stages()
        activation_patching(tiny, task, progress=seen)
        assert seen.stages == [[label, total, unit, total]]
    seen = _Stages()
    path_patching(tiny, one, parse_receiver("logits"), senders=[(0, 1)], progress=seen)
    assert seen.stages == [["path patching", 1, "sender", 1]]
