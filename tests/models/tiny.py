"""Tiny random Hugging Face models of every supported family, built in-process (no download)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from headlab.models import default_model_path

VOCAB = 30522  # the bundled MiniLM tokenizer is reused for every tiny model

FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {
        "model_type": "bert",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
    "roberta": {
        "model_type": "roberta",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 130,
        "pad_token_id": 0,
    },
    "distilbert": {
        "model_type": "distilbert",
        "dim": 32,
        "n_layers": 2,
        "n_heads": 4,
        "hidden_dim": 64,
        "max_position_embeddings": 128,
    },
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128},
    "llama": {
        "model_type": "llama",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "sliding_window": 5,
    },
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "rotary_pct": 0.5,
        "max_position_embeddings": 128,
    },
}

#: post-norm ("sandwich") decoders, kept out of :data:`FAMILIES` (whose every family the model
#: and pruning tests run): Gemma 3 with a query/key norm per head, two sliding-window layers
#: then a global one; Gemma 2; OLMo 2
POST_NORM_FAMILIES: dict[str, dict[str, Any]] = {
    "gemma3": {
        "model_type": "gemma3_text",
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "sliding_window": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    },
    # Gemma 3's block without query/key norms, attention scores soft-capped
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        "sliding_window": 3,
    },
    # norms on the sublayers' outputs only; query and key norms across all heads
    "olmo2": {
        "model_type": "olmo2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
}


def tokenizer_path() -> Path:
    """The MiniLM tokenizer's folder: ``HEADLAB_TEST_TOKENIZER`` when set (a copy of its
    tokenizer files, where the 83 MB model package is not installed: ``benchmarks/gpu.sh``),
    else the installed default model's."""
    copy = os.environ.get("HEADLAB_TEST_TOKENIZER")
    return Path(copy) if copy else default_model_path()


def build(
    family: str,
    folder: Path,
    *,
    attn_implementation: str = "sdpa",
    seed: int = 0,
    lm_head: bool = False,
    random_gains: bool = False,
    **overrides: Any,
) -> Path:
    """Save a tiny random model of ``family`` (of :data:`FAMILIES` or
    :data:`POST_NORM_FAMILIES`) with the MiniLM tokenizer into ``folder`` (with its causal
    language-model head when ``lm_head``; with every norm's gain random when ``random_gains``,
    not its initial 1, or Gemma's 0 in ``1 + g``; ``overrides``: config fields to change, e.g.
    ``sliding_window=2``, or ``vocab_size`` below the tokenizer's for weight-only tests)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    spec = {"vocab_size": VOCAB, **{**FAMILIES, **POST_NORM_FAMILIES}[family], **overrides}
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(model_type, **spec)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = (AutoModelForCausalLM if lm_head else AutoModel).from_config(config)
    # random biases everywhere, so that no bias path is tested only at zero
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.1)
            elif random_gains and "norm" in name and p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True).save_pretrained(
        folder
    )
    return folder
