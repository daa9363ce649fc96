"""Path patching against a loop written with plain hooks (one forward per sender and prompt,
float64), on tiny random Llama (GQA), GPT-2 and Qwen2 models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.causal.test_patching import _blocks, _ld, _out_projs, _random_task, _record, tiny  # noqa: F401

from headlab.causal.paths import Receiver, parse_receiver, path_patching
from headlab.errors import InputError


def _receiver_module(model: torch.nn.Module, receiver: Receiver, d: int) -> tuple:  # type: ignore[type-arg]
    """The receiver's projection and its columns, by the family's own names."""
    block = _blocks(model)[receiver.layer]
    if hasattr(block, "attn"):  # GPT-2: c_attn is [q | k | v], each of the model's width
        width = model.config.n_embd
        start = "qkv".index(receiver.kind) * width + receiver.head * d
        return block.attn.c_attn, slice(start, start + d)
    attn = block.self_attn
    module = {"q": attn.q_proj, "k": attn.k_proj, "v": attn.v_proj}[receiver.kind]
    return module, slice(receiver.head * d, (receiver.head + 1) * d)


def _oracle(model, raw, receiver: Receiver, n_heads: int, d: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    projs = _out_projs(model)
    top = len(projs) if receiver.kind == "logits" else receiver.layer
    patched = torch.zeros(top, n_heads, dtype=torch.float64)
    clean_sum = corrupt_sum = 0.0
    for clean, corrupt, answer, distractor in raw:
        c_ids, x_ids = torch.tensor([clean]), torch.tensor([corrupt])
        clean_z, corrupt_z = _record(model, c_ids), _record(model, x_ids)
        with torch.no_grad():
            clean_sum += _ld(model, c_ids, answer, distractor)
            corrupt_sum += _ld(model, x_ids, answer, distractor)
        for layer in range(top):
            for head in range(n_heads):
                cols = slice(head * d, (head + 1) * d)

                def step1(m, a, i, layer=layer, cols=cols):
                    x = a[0].clone()
                    if i == layer:
                        x[..., cols] = corrupt_z[i][..., cols]  # noqa: B023  # noqa: B023
                    elif i > layer:
                        x = clean_z[i].clone()  # noqa: B023 (every other head frozen at clean)  # noqa: B023
                    return (x,)

                hooks = [
                    p.register_forward_pre_hook(lambda m, a, i=i: step1(m, a, i))
                    for i, p in enumerate(projs)
                ]
                seen = {}
                if receiver.kind != "logits":
                    module, rcols = _receiver_module(model, receiver, d)
                    hooks.append(
                        module.register_forward_hook(
                            lambda m, a, o: seen.__setitem__("x", o.clone())  # noqa: B023  # noqa: B023
                        )
                    )
                with torch.no_grad():
                    ld = _ld(model, c_ids, answer, distractor)
                for h in hooks:
                    h.remove()
                if receiver.kind != "logits":

                    def step2(m, a, o, rcols=rcols):
                        o = o.clone()
                        o[..., rcols] = seen["x"][..., rcols]  # noqa: B023  # noqa: B023
                        return o

                    hook = module.register_forward_hook(step2)
                    with torch.no_grad():
                        ld = _ld(model, c_ids, answer, distractor)
                    hook.remove()
                patched[layer, head] += ld
    n = len(raw)
    clean, corrupt = clean_sum / n, corrupt_sum / n
    return (clean - patched / n) / (clean - corrupt)


@pytest.mark.parametrize("name", ["q:1.2", "k:1.1", "v:1.0", "logits"])
def test_path_patching_matches_a_loop_with_hooks(tiny, name):  # noqa: F811
    receiver = parse_receiver(name)
    task, raw = _random_task(tiny, 3, 8, seed=12)
    got = path_patching(tiny, task, receiver, max_rows=6)
    n_heads, d = tiny.layout.heads_per_layer[0], tiny.head_dim
    expected = _oracle(tiny.model, raw, receiver, n_heads, d)
    rows = expected.shape[0]
    torch.testing.assert_close(got.effects[:rows], expected, atol=1e-9, rtol=1e-9)
    assert got.effects[rows:].isnan().all()  # no sender at or above the receiver
    assert (expected.abs() > 1e-7).any()
    out = got.to_json()
    assert out["receiver"] == name and len(out["senders"]) == rows * n_heads


def test_bad_receivers_and_senders_are_one_line(tiny):  # noqa: F811
    task, _ = _random_task(tiny, 2, 6, seed=1)
    for text, message in [
        ("q:9.0", "layer must be in 0..1"),
        ("k:1.7", "has KV heads"),
        ("q:0.1", "no head sends to layer 0"),
    ]:
        with pytest.raises(InputError, match=message):
            path_patching(tiny, task, parse_receiver(text))
    with pytest.raises(InputError, match="a receiver is logits or q"):
        parse_receiver("z:1.1")
    with pytest.raises(InputError, match="not below receiver"):
        path_patching(tiny, task, parse_receiver("q:1.0"), senders=[(1, 0)])


def test_headlab_patch_path_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.causal.test_patch_cli import PROMPTS, _jsonl
    from tests.models.tiny import build

    from headlab.cli import main

    folder = build("llama", tmp_path / "m", lm_head=True, seed=5)
    prompts = _jsonl(tmp_path / "ioi.jsonl", PROMPTS)
    argv = ["-q", "patch", "--model", str(folder), "--prompts", str(prompts), "--json"]
    assert main([*argv, "--path", "0.1", "--to", "k:1.0"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["receiver"] == "k:1.0" and [(s["layer"], s["head"]) for s in one["senders"]] == [
        (0, 1)
    ]
    assert main([*argv, "--to", "logits"]) == 0  # every sender to the logits, batched
    every = json.loads(capsys.readouterr().out)
    assert len(every["senders"]) == 8
