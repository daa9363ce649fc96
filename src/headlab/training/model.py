"""A small transformer built on headlab's own :class:`MultiHeadAttention`.

GPT-2's layout (learned positions, pre-LayerNorm blocks, tanh-GELU MLP, tied output embedding),
so that a trained model exports to a Hugging Face ``GPT2LMHeadModel`` folder that the rest of
headlab (``headlab roles``, ``headlab heads``...) opens like any other model.

Shapes: ``B`` batch, ``T`` tokens, ``E`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from headlab.attention import MultiHeadAttention
from headlab.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Size of a :class:`TinyTransformer`. ``head_dim`` is ``d_model // n_heads``."""

    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_len: int = 128
    causal: bool = True
    #: False gives an attention-only transformer (Olsson et al. 2022's toy models): nothing
    #: but attention can combine information from different positions or features
    mlp: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}: heads split "
                "the width, they do not add to it"
            )


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = MultiHeadAttention(d_model=cfg.d_model, n_heads=cfg.n_heads)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.causal = cfg.causal
        self.mlp = cfg.mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, E)
        x = x + self.attn(self.ln_1(x), is_causal=self.causal)
        if not self.mlp:
            return x
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class TinyTransformer(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, a final LayerNorm."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.apply(_init)

    @property
    def layers(self) -> list[Block]:
        """The blocks, typed."""
        return [cast(Block, b) for b in self.blocks]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, E)`` final hidden states."""
        if ids.shape[1] > self.cfg.max_len:
            raise ConfigError(f"input of {ids.shape[1]} tokens exceeds max_len {self.cfg.max_len}")
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.layers:
            x = block(x)
        return self.ln_f(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(B, T, V)`` through the tied output embedding."""
        return self.hidden(ids) @ self.wte.weight.t()


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@torch.no_grad()
def to_gpt2(model: TinyTransformer, *, special_id: int = 0) -> Any:
    """The same network as a Hugging Face ``GPT2LMHeadModel`` (weights copied); ``special_id``
    is the tokenizer's BOS/EOS id."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    if not cfg.causal or not cfg.mlp:
        raise ConfigError("only causal models with MLPs export to GPT-2")
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.max_len,
            n_embd=cfg.d_model,
            n_layer=cfg.n_layers,
            n_head=cfg.n_heads,
            n_inner=cfg.d_ff,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            bos_token_id=special_id,
            eos_token_id=special_id,
        )
    ).eval()
    t = hf.transformer
    t.wte.weight.copy_(model.wte.weight)
    t.wpe.weight.copy_(model.wpe.weight)
    for block, h in zip(model.layers, cast(Any, t.h), strict=True):
        h.ln_1.load_state_dict(block.ln_1.state_dict())
        h.ln_2.load_state_dict(block.ln_2.state_dict())
        # Conv1D keeps (in, out): the transposes of nn.Linear's (out, in)
        h.attn.c_attn.weight.copy_(block.attn.in_proj.weight.t())
        h.attn.c_attn.bias.copy_(block.attn.in_proj.bias)
        h.attn.c_proj.weight.copy_(block.attn.out_proj.weight.t())
        h.attn.c_proj.bias.copy_(block.attn.out_proj.bias)
        h.mlp.c_fc.weight.copy_(block.fc.weight.t())
        h.mlp.c_fc.bias.copy_(block.fc.bias)
        h.mlp.c_proj.weight.copy_(block.proj.weight.t())
        h.mlp.c_proj.bias.copy_(block.proj.bias)
    t.ln_f.load_state_dict(model.ln_f.state_dict())
    hf.tie_weights()
    return hf


def save_checkpoint(model: TinyTransformer, folder: Path, extra: dict[str, Any]) -> None:
    """``model.safetensors`` and ``headlab_model.json`` (config plus ``extra``) in ``folder``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "headlab_model.json").write_text(
        json.dumps({"config": asdict(model.cfg), **extra}, indent=2) + "\n"
    )


def load_checkpoint(folder: Path) -> TinyTransformer:
    """A model saved by :func:`save_checkpoint`."""
    from safetensors.torch import load_file

    meta = json.loads((folder / "headlab_model.json").read_text())
    model = TinyTransformer(ModelConfig(**meta["config"]))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval()
