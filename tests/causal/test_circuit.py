"""Circuits (#44): the graph, EAP edge scores against finite differences of edge patching, and
the circuit run against an independent hook implementation that rebuilds every receiver's input
from the senders it keeps and the corrupted ones it leaves out (float64, tiny random models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.causal.test_patching import _random_task
from tests.models.tiny import build

from headlab.causal.circuit import _record, circuit_logit_differences, edge_scores
from headlab.causal.edges import EdgeRun
from headlab.causal.graph import build_graph
from headlab.causal.metric import last_logits, logit_difference
from headlab.errors import InputError
from headlab.models import load
from headlab.models.loading import LoadedModel


# llama: 4 query heads on 2 KV heads; gemma3: post-norm blocks, query/key norms, sliding windows
@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma3"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    folder = build(
        request.param,
        tmp_path_factory.mktemp(request.param),
        lm_head=True,
        attn_implementation="eager",
        seed=3,
        random_gains=request.param == "gemma3",  # Gemma's gains start at 0 in (1 + g)
    )
    lm = load(folder, with_lm_head=True)
    lm.model.double()
    return lm


def test_the_graph_has_every_sender_receiver_and_edge(tiny: LoadedModel) -> None:
    graph = build_graph(tiny)
    n_layers, n_heads = tiny.n_layers, tiny.layout.heads_per_layer[0]
    n_kv = tiny.layout.kv_heads_per_layer[0]
    assert graph.senders[0] == "embed" and graph.receivers[-1] == "logits"
    assert len(graph.senders) == 1 + n_layers * (n_heads + 1)
    assert len(graph.receivers) == n_layers * (n_heads + 2 * n_kv + 1) + 1
    # edges into layer l's heads: the embeddings and everything below; into its MLP: its heads too
    expected = sum(
        (n_heads + 2 * n_kv) * (1 + l * (n_heads + 1)) + 1 + l * (n_heads + 1) + n_heads
        for l in range(n_layers)  # noqa: E741
    ) + len(graph.senders)
    assert graph.n_edges == expected
    assert not graph.edges[graph.mlp_sender(0), graph.receiver_range(0, "mlp").start]
    assert graph.edges[graph.head_senders(1)[0], graph.receiver_range(1, "mlp").start]
    assert not graph.edges[graph.head_senders(1)[0], graph.receiver_range(1, "q").start]


def test_each_block_is_found_by_what_feeds_what(tiny: LoadedModel) -> None:
    """The norms a block reads and writes through, traced, are the family's own (in Gemma the
    MLP reads ``pre_feedforward_layernorm``; ``post_attention_layernorm`` normalises the
    attention's output)."""
    graph = build_graph(tiny)
    parts, final = _parts(tiny.model)
    assert graph.final_norm is final
    for block, (norm1, _, _, norm2, mlp, post1, post2) in zip(graph.blocks, parts, strict=True):
        assert (block.attention_norm, block.mlp_norm, block.mlp) == (norm1, norm2, mlp)
        assert block.mlp_out is post2
        if post1 is None:
            assert block.attention_out is None
        else:
            assert block.attention_out is not None and block.attention_out.module is post1
            assert block.attention_out.kind == "rmsnorm (1 + g)"


def test_the_full_graph_is_the_clean_model_and_the_empty_one_the_corrupted(
    tiny: LoadedModel,
) -> None:
    """Every logit at every position, not only the metric: all edges kept is the clean run,
    none the corrupted run (in post-norm blocks too, where each run's heads write through their
    output norm at that run's own scale)."""
    _assert_both_ends(tiny)


def _assert_both_ends(lm: LoadedModel) -> None:
    graph = build_graph(lm)
    task, _ = _random_task(lm, 3, 9, seed=2)
    batch = task.batches[0]
    corrupt, _ = _record(lm, graph, batch, batch.corrupt)
    with torch.inference_mode():
        clean_logits = lm.model(input_ids=batch.clean).logits
        corrupt_logits = lm.model(input_ids=batch.corrupt).logits
    assert (clean_logits - corrupt_logits).abs().max() > 1e-2
    for left_out, want in ((0.0, clean_logits), (1.0, corrupt_logits)):
        w = torch.full(graph.edges.shape, left_out, dtype=torch.float64)
        with torch.inference_mode(), EdgeRun(lm, graph, corrupt=corrupt.values, left_out=w):
            got = lm.model(input_ids=batch.clean).logits
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["gemma2", "olmo2"])
def test_other_post_norm_blocks_are_exact_at_both_ends(family: str, tmp_path: Path) -> None:
    """Gemma 2 (Gemma 3's block, attention scores soft-capped) and OLMo 2 (the attention and
    the MLP read the residual as is, their outputs normalised); EAP's scores are finite."""
    folder = build(
        family, tmp_path / family, lm_head=True, seed=3, random_gains=True,
        attn_implementation="eager",
    )  # fmt: skip
    lm = load(folder, with_lm_head=True)
    lm.model.double()
    graph = build_graph(lm)
    for block in graph.blocks:
        assert block.attention_norm is getattr(block.layer, "input_layernorm", None)
        assert block.mlp_norm is getattr(block.layer, "pre_feedforward_layernorm", None)
        assert block.attention_out is not None
        assert block.attention_out.module is block.layer.post_attention_layernorm
        assert block.mlp_out is block.layer.post_feedforward_layernorm
    _assert_both_ends(lm)
    task, _ = _random_task(lm, 3, 9, seed=1)
    scores = edge_scores(lm, task, graph=graph).scores
    assert torch.isfinite(scores).all() and scores.abs().max() > 0


def test_an_encoder_is_refused_in_one_line(tmp_path: Path) -> None:
    lm = load(build("bert", tmp_path / "bert"))
    with pytest.raises(InputError, match=r"circuits need a pre-norm decoder.*it is an encoder"):
        build_graph(lm)


def _mean_ld(lm: LoadedModel, batch, run: EdgeRun) -> float:  # type: ignore[no-untyped-def]
    with torch.inference_mode(), run:
        logits = last_logits(lm, batch.clean)
    return float(logit_difference(logits, batch.answer, batch.distractor).mean())


def _gemma_norm_in_float64(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Gemma 3's RMSNorm as transformers writes it, in the input's precision (no float32)."""
    return self._norm(x) * (1.0 + self.weight)


def test_eap_scores_are_the_derivative_of_edge_patching(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each edge's EAP score is d LD / d eps with the edge patched eps of the way to its
    corrupted value: central differences at eps = 1e-2 on every edge (Llama's RMSNorm computes
    in float32 inside, whence the tolerance). Gemma 3's curvature wants a smaller step (its
    largest error at 1e-2 is 1e-5, at 1e-3 1e-7), which its float32 norms would drown: there
    the norms compute in float64 and eps is 1e-3."""
    eps = 1e-2
    if tiny.model.config.model_type == "gemma3_text":
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

        monkeypatch.setattr(Gemma3RMSNorm, "forward", _gemma_norm_in_float64)
        eps = 1e-3
    graph = build_graph(tiny)
    task, _ = _random_task(tiny, 3, 9, seed=1)
    scores = edge_scores(tiny, task)
    batch = task.batches[0]
    corrupt, _ = _record(tiny, graph, batch, batch.corrupt)
    edges = graph.edges.nonzero().tolist()
    assert len(edges) == graph.n_edges
    got, want = [], []
    for s, r in edges:
        sides = []
        for e in (eps, -eps):
            w = torch.zeros(graph.edges.shape, dtype=torch.float64)
            w[s, r] = e
            sides.append(
                _mean_ld(tiny, batch, EdgeRun(tiny, graph, corrupt=corrupt.values, left_out=w))
            )
        got.append(float(scores.scores[s, r]))
        want.append((sides[0] - sides[1]) / (2 * eps))
    got_t, want_t = torch.tensor(got), torch.tensor(want)
    scale = float(want_t.abs().max())
    assert scale > 0 and (got_t != 0).sum() > len(edges) // 2
    torch.testing.assert_close(got_t, want_t, atol=1e-4 * scale + 1e-12, rtol=0)
    # EAP-IG with one step takes the gradient at the clean end: EAP's
    one = edge_scores(tiny, task, method="eap-ig", steps=1)
    torch.testing.assert_close(one.scores, scores.scores)
    five = edge_scores(tiny, task, method="eap-ig", steps=5)
    assert not torch.allclose(five.scores, scores.scores)
    assert (scores.clean, scores.corrupt) == (five.clean, five.corrupt)


# ---------------------------------------------------------------- the independent circuit run
def _parts(model: torch.nn.Module) -> tuple[list, torch.nn.Module]:  # type: ignore[type-arg]
    """Per block (norm1, {kind: (module, first column)}, out projection, norm2, mlp, the norm
    on the attention's output, the norm on the MLP's output), by the family's own names (the
    last two ``None`` but in Gemma); and the final norm."""
    if hasattr(model, "transformer"):  # GPT-2: c_attn is [q | k | v], each n_embd wide
        width = model.config.n_embd
        blocks = [
            (
                b.ln_1,
                {k: (b.attn.c_attn, i * width) for i, k in enumerate("qkv")},
                b.attn.c_proj,
                b.ln_2,
                b.mlp,
                None,
                None,
            )
            for b in model.transformer.h
        ]
        return blocks, model.transformer.ln_f
    blocks = [
        (
            b.input_layernorm,
            {
                "q": (b.self_attn.q_proj, 0),
                "k": (b.self_attn.k_proj, 0),
                "v": (b.self_attn.v_proj, 0),
            },
            b.self_attn.o_proj,
            *(
                (b.pre_feedforward_layernorm, b.mlp, b.post_attention_layernorm)
                if hasattr(b, "pre_feedforward_layernorm")  # Gemma: post_attention is post1
                else (b.post_attention_layernorm, b.mlp, None)
            ),
            getattr(b, "post_feedforward_layernorm", None),
        )
        for b in model.model.layers
    ]
    return blocks, model.model.norm


def _linear(module: torch.nn.Module, x: torch.Tensor, cols: slice) -> torch.Tensor:
    if type(module).__name__ == "Conv1D":  # weight (in, out)
        return x @ module.weight[:, cols] + module.bias[cols]
    bias = 0.0 if module.bias is None else module.bias[cols]
    return x @ module.weight[cols].t() + bias


def _gemma_norm_scale(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm ``x / rms(x) * (1 + g)`` without the ``x``: ``(1 + g) / rms(x)``."""
    return (1.0 + norm.weight) / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()


def _oracle(lm: LoadedModel, batch, keep: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    """Every receiver's input summed from scratch: the senders it keeps at their value in this
    run, the others at their value in the corrupted run, plus the output biases below. Under a
    norm on the attention's output (Gemma) a head's value is its output through that norm at
    the scale of the run it was recorded in; the MLP's, its output norm's output."""
    model, graph = lm.model, build_graph(lm)
    blocks, final = _parts(model)
    n_heads, n_kv, d = lm.layout.heads_per_layer[0], lm.layout.kv_heads_per_layer[0], lm.head_dim

    def hooks(store: dict, patch: dict | None) -> list:  # type: ignore[type-arg]
        handles = []
        names = graph.senders

        def o_pre(layer: int):  # type: ignore[no-untyped-def]
            def f(m, a):  # type: ignore[no-untyped-def]
                z = a[0]
                w = m.weight.t() if type(m).__name__ == "Conv1D" else m.weight  # (E, H*D)
                for h in range(n_heads):
                    cols = slice(h * d, (h + 1) * d)
                    store[f"{layer}.{h}"] = z[..., cols] @ w[:, cols].t()

            return f

        def bias_below(layer: int) -> torch.Tensor | float:
            total: torch.Tensor | float = 0.0
            for i in range(layer):
                if blocks[i][2].bias is not None:
                    total = total + blocks[i][2].bias
            return total

        def receiver_input(r: str, upto_layer: int) -> torch.Tensor:
            j = graph.receivers.index(r)
            total = bias_below(upto_layer)
            for i, s in enumerate(names):
                if graph.edges[i, j]:
                    total = total + (store[s] if keep[i, j] else patch[s])
            return total  # type: ignore[return-value]

        for layer, (norm1, projs, out_proj, norm2, mlp, post1, post2) in enumerate(blocks):
            if layer == 0:  # the embeddings: what the first block reads

                def first_block(m, a, kw):  # type: ignore[no-untyped-def]
                    store["embed"] = a[0] if a else kw["hidden_states"]

                stack = model.transformer.h if hasattr(model, "transformer") else model.model.layers
                handles.append(stack[0].register_forward_pre_hook(first_block, with_kwargs=True))
            handles.append(out_proj.register_forward_pre_hook(o_pre(layer)))
            if post1 is not None:

                def frozen(m, a, o, layer=layer):  # type: ignore[no-untyped-def]
                    scale = _gemma_norm_scale(m, a[0])  # (B, T, E), this run's
                    for h in range(n_heads):
                        store[f"{layer}.{h}"] = store[f"{layer}.{h}"] * scale

                handles.append(post1.register_forward_hook(frozen))

            def mlp_out(m, a, o, layer=layer):  # type: ignore[no-untyped-def]
                store[f"mlp {layer}"] = o

            handles.append((mlp if post2 is None else post2).register_forward_hook(mlp_out))
            if patch is None:
                continue
            for kind, (module, first) in projs.items():
                count = n_heads if kind == "q" else n_kv

                def proj(m, a, o, layer=layer, kind=kind, first=first, count=count, norm1=norm1):  # type: ignore[no-untyped-def]
                    o = o.clone()
                    for g in range(count):
                        cols = slice(first + g * d, first + (g + 1) * d)
                        x = receiver_input(f"{kind}:{layer}.{g}", layer)
                        o[..., cols] = _linear(m, norm1(x), cols)
                    return o

                handles.append(module.register_forward_hook(proj))

            def mlp_in(m, a, layer=layer, norm2=norm2):  # type: ignore[no-untyped-def]
                return (norm2(receiver_input(f"mlp {layer}", layer + 1)),)

            handles.append(mlp.register_forward_pre_hook(mlp_in))
        if patch is not None:
            handles.append(
                final.register_forward_pre_hook(
                    lambda m, a: (receiver_input("logits", len(blocks)),)
                )
            )
        return handles

    corrupt: dict = {}
    handles = hooks(corrupt, None)
    with torch.no_grad():
        model(input_ids=batch.corrupt)
    for h in handles:
        h.remove()
    current: dict = {}
    handles = hooks(current, corrupt)
    with torch.no_grad():
        logits = model(input_ids=batch.clean).logits[:, -1]
    for h in handles:
        h.remove()
    return float(logit_difference(logits, batch.answer, batch.distractor).mean())


def test_the_circuit_run_equals_patching_each_left_out_edge(tiny: LoadedModel) -> None:
    graph = build_graph(tiny)
    task, _ = _random_task(tiny, 3, 9, seed=2)
    g = torch.Generator().manual_seed(0)
    circuits = [
        graph.edges & (torch.rand(graph.edges.shape, generator=g) < p) for p in (0.2, 0.5, 0.8)
    ]
    circuits += [graph.edges.clone(), torch.zeros_like(graph.edges)]
    got, clean, corrupt = circuit_logit_differences(tiny, graph, task, circuits)
    want = [_oracle(tiny, task.batches[0], keep) for keep in circuits[:3]]
    assert got[:3] == pytest.approx(want, abs=1e-6)
    assert len({round(x, 6) for x in got[:3]}) == 3  # three circuits, three answers
    # all edges kept: the clean run; none: the corrupted run
    assert got[3] == pytest.approx(clean, abs=1e-9) and got[4] == pytest.approx(corrupt, abs=1e-9)
    assert abs(clean - corrupt) > 1e-4


def test_a_circuit_without_one_head_s_edges_is_that_head_patched(tiny: LoadedModel) -> None:
    """#59: a circuit answers sufficiency (every edge outside it corrupted), patching one head
    answers necessity; they meet at the circuit that keeps every edge but those one head sends.
    Its logit difference is the clean run with that head's output patched from the corrupted
    run, so one minus its faithfulness is the head's patching effect, head by head. Not in a
    post-norm block (Gemma 3): there a head's edges write through the norm at the scale of
    the run they come from, where patching renormalises the patched sum (docs/circuits.md)."""
    from headlab.causal.patching import run_patching

    graph = build_graph(tiny)
    if any(b.attention_out is not None for b in graph.blocks):
        pytest.skip("post-norm: a head's edges are not its output through the norm")
    task, _ = _random_task(tiny, 3, 9, seed=2)
    patched = run_patching(tiny, task)  # activation patching from the corrupted run
    layers, heads = patched.effects.shape
    chosen = [(0, 0), (layers - 1, heads - 1), (layers // 2, 1)]
    circuits = []
    for layer, head in chosen:
        keep = graph.edges.clone()
        keep[graph.senders.index(f"{layer}.{head}")] = False  # none of its edges
        circuits.append(keep)
    got, clean, corrupt = circuit_logit_differences(tiny, graph, task, circuits)
    assert clean == pytest.approx(patched.clean, abs=1e-6)
    assert corrupt == pytest.approx(patched.corrupt, abs=1e-6)
    effects = [(clean - ld) / (clean - corrupt) for ld in got]
    want = [float(patched.effects[layer, head]) for layer, head in chosen]
    assert effects == pytest.approx(want, abs=1e-5)
    assert max(abs(e) for e in effects) > 1e-3  # the heads chosen do something


# ---------------------------------------------------------------- cutting and the curve
def test_cut_circuits_lead_to_the_logits(tiny: LoadedModel) -> None:
    from headlab.causal.cut import first_edges, greedy_order, owners, reaching_logits, top_edges

    graph = build_graph(tiny)
    task, _ = _random_task(tiny, 3, 9, seed=1)
    scores = edge_scores(tiny, task).scores
    feeds = owners(graph)
    order = greedy_order(graph, scores)
    assert len(order) == graph.n_edges == len(set(order))
    in_circuit = {len(graph.receivers) - 1}  # the logits
    for s, r in order:  # every edge's receiver is in the circuit when the edge joins
        assert r in in_circuit, (graph.senders[s], graph.receivers[r])
        in_circuit |= set(feeds[:, s].nonzero().flatten().tolist())
    for n in (1, 5, 20):
        keep = first_edges(graph, order, n)
        assert int(keep.sum()) == n and torch.equal(reaching_logits(graph, keep), keep)
    # a head whose only kept edge feeds a head that reaches nothing is dropped
    head, receiver = graph.head_senders(0)[0], graph.receiver_range(1, "q").start
    dangling = torch.zeros_like(graph.edges)
    dangling[head, receiver] = True
    assert not reaching_logits(graph, dangling).any()
    dangling[graph.head_senders(1)[0], -1] = True  # now 1.0 feeds the logits
    assert int(reaching_logits(graph, dangling).sum()) == 2
    top = top_edges(graph, scores, 10)
    assert int(top.sum()) <= 10 and torch.equal(reaching_logits(graph, top), top)
    with pytest.raises(InputError, match=f"a circuit has 0..{graph.n_edges} edges"):
        top_edges(graph, scores, graph.n_edges + 1)


def test_the_curve_runs_from_the_corrupted_to_the_clean_model(tiny: LoadedModel) -> None:
    from headlab.causal.circuit import faithfulness_curve

    find, _ = _random_task(tiny, 3, 9, seed=1)
    held, _ = _random_task(tiny, 3, 9, seed=4)
    scores = edge_scores(tiny, find)
    n = scores.graph.n_edges
    curve = faithfulness_curve(tiny, scores, held, sizes=[0, 3, n])
    assert curve.edges == [0, 3, n]
    assert curve.faithfulness[0] == pytest.approx(0.0, abs=1e-9)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-9)
    assert curve.smallest[0.9] is not None and curve.edges[curve.smallest[0.9]] <= n
    with pytest.raises(InputError, match="search must be one of greedy, top"):
        faithfulness_curve(tiny, scores, held, sizes=[3], search="best")  # type: ignore[arg-type]


# ---------------------------------------------------------------- learned edge masks


def test_the_differentiable_run_is_the_derivative_of_the_whole_patch(
    tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Edge pruning trains every edge's mask through the whole network: with half of every
    edge left out, the gradient of the logit difference with respect to each edge's weight
    (through every later sender, not only the edge's receiver) equals a central difference of
    the same run, and the run itself is the non-differentiable one."""
    eps = 1e-2
    if tiny.model.config.model_type == "gemma3_text":
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

        monkeypatch.setattr(Gemma3RMSNorm, "forward", _gemma_norm_in_float64)
        eps = 1e-3
    graph = build_graph(tiny)
    task, _ = _random_task(tiny, 3, 9, seed=1)
    batch = task.batches[0]
    corrupt, _ = _record(tiny, graph, batch, batch.corrupt)
    half = torch.full(graph.edges.shape, 0.5, dtype=torch.float64) * graph.edges
    w = half.clone().requires_grad_(True)
    with EdgeRun(tiny, graph, corrupt=corrupt.values, left_out=w, differentiable=True):
        ld = logit_difference(last_logits(tiny, batch.clean), batch.answer, batch.distractor)
    ld.mean().backward()
    plain = _mean_ld(tiny, batch, EdgeRun(tiny, graph, corrupt=corrupt.values, left_out=half))
    assert float(ld.detach().mean()) == pytest.approx(plain, abs=1e-9)
    assert w.grad is not None
    edges = graph.edges.nonzero().tolist()
    got, want = [], []
    for s, r in edges[:: max(1, len(edges) // 40)]:
        sides = []
        for e in (eps, -eps):
            moved = half.clone()
            moved[s, r] += e
            run = EdgeRun(tiny, graph, corrupt=corrupt.values, left_out=moved)
            sides.append(_mean_ld(tiny, batch, run))
        got.append(float(w.grad[s, r]))
        want.append((sides[0] - sides[1]) / (2 * eps))
    got_t, want_t = torch.tensor(got), torch.tensor(want)
    scale = float(want_t.abs().max())
    assert scale > 0
    # half-patched, a second derivative shows at eps 1e-2 (largest gap 2e-4 of the scale)
    torch.testing.assert_close(got_t, want_t, atol=1e-3 * scale + 1e-12, rtol=0)
