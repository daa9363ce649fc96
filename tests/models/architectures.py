"""Tiny random configs of every model type the architecture matrix covers, built in-process.

Each entry is a ``model_type`` and the config fields that make it tiny (2 layers, width 32,
4 heads of width 8, GQA where the family has it). ``build_model`` makes the model with random
biases; ``inputs`` makes a batch of two rows (the second padded) of the kind the model reads.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

VOCAB = 30522  # the MiniLM tokenizer's, so that folders saved from these models tokenize
SMALL: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "vocab_size": VOCAB,
}
GQA: dict[str, Any] = {**SMALL, "num_key_value_heads": 2, "head_dim": 8, "pad_token_id": 0}
SEQ2SEQ: dict[str, Any] = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
    "vocab_size": VOCAB,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "decoder_start_token_id": 2,
    "forced_eos_token_id": None,
}
T5: dict[str, Any] = {
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_heads": 4,
    "num_layers": 2,
    "num_decoder_layers": 2,
    "vocab_size": VOCAB,
    "decoder_start_token_id": 0,
}
VISION: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 16,
    "patch_size": 4,
}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    # encoders
    "bert": SMALL,
    "roberta": {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66},
    "xlm-roberta": {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66},
    "camembert": {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66},
    "data2vec-text": {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66},
    "electra": {**SMALL, "embedding_size": 16},
    "ernie": SMALL,
    "albert": {**SMALL, "embedding_size": 16},
    "distilbert": SMALL,
    "modernbert": {
        **SMALL,
        "pad_token_id": 0,
        "bos_token_id": 101,
        "eos_token_id": 102,
        "cls_token_id": 101,
        "sep_token_id": 102,
        "local_attention": 4,
    },
    "mobilebert": {**SMALL, "embedding_size": 16, "intra_bottleneck_size": 32},
    # decoders
    "gpt2": SMALL,
    "gptj": {**SMALL, "rotary_dim": 4},
    "codegen": {**SMALL, "rotary_dim": 4},
    "gpt_neox": {**SMALL, "rotary_pct": 0.5},
    "gpt_bigcode": {**SMALL, "multi_query": True},
    "opt": {**SMALL, "ffn_dim": 64, "word_embed_proj_dim": 32, "pad_token_id": 1},
    "gemma": GQA,
    "gemma2": {**GQA, "sliding_window": 4, "attn_logit_softcapping": 20.0},
    "gemma3_text": {**GQA, "sliding_window": 4, "sliding_window_pattern": 2},
    "llama": GQA,
    "mistral": {**GQA, "sliding_window": 4},
    "mixtral": {**GQA, "num_local_experts": 2, "num_experts_per_tok": 1},
    "qwen2": {**GQA, "attention_bias": True},
    "qwen2_moe": {
        **GQA,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    "qwen3": GQA,
    "qwen3_moe": {**GQA, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32},
    "phi": {**SMALL, "partial_rotary_factor": 0.5},
    "phi3": {**GQA, "head_dim": None, "pad_token_id": 0},
    "olmo": GQA,
    "olmo2": GQA,
    "olmoe": {**GQA, "num_experts": 2, "num_experts_per_tok": 1},
    "stablelm": {**GQA, "head_dim": None},
    "starcoder2": {**GQA, "head_dim": None},
    "cohere": GQA,
    "granite": GQA,
    "granitemoe": {**GQA, "num_local_experts": 2, "num_experts_per_tok": 1},
    "smollm3": GQA,
    "helium": GQA,
    # multi-query with a fused projection; through the attention interface since transformers 5.25
    "falcon": {**SMALL, "multi_query": True},
    # encoder-decoders
    "t5": T5,
    "mt5": T5,
    "bart": SEQ2SEQ,
    "mbart": SEQ2SEQ,
    "marian": {**SEQ2SEQ, "decoder_vocab_size": VOCAB},
    "pegasus": SEQ2SEQ,
    "m2m_100": SEQ2SEQ,
    "whisper": {
        **SEQ2SEQ,
        "num_mel_bins": 8,
        "max_source_positions": 8,
        "max_target_positions": 16,
        "suppress_tokens": [],
        "begin_suppress_tokens": [],
    },
    # vision
    "vit": VISION,
    "clip_vision_model": VISION,
    "clip_text_model": {**SMALL, "max_position_embeddings": 64, "eos_token_id": 102},
    # both towers: a text and an image per row
    "clip": {
        "text_config": {**SMALL, "max_position_embeddings": 64, "eos_token_id": 102},
        "vision_config": VISION,
        "projection_dim": 16,
    },
}

#: types whose attention does not go through transformers' attention interface (checked: one
#: line refusal), with their tiny configs
NOT_INTERFACE: dict[str, dict[str, Any]] = {
    "deberta-v2": SMALL,
    "mpnet": SMALL,
    "bloom": {"hidden_size": 32, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB},
}


def config(model_type: str, **overrides: Any) -> Any:
    from transformers import AutoConfig

    fields = {**ARCHITECTURES.get(model_type, NOT_INTERFACE.get(model_type, {})), **overrides}
    fields = {k: v for k, v in fields.items() if v is not None}
    return AutoConfig.for_model(model_type, **fields)


def build_model(
    model_type: str, *, seed: int = 0, attn_implementation: str | None = None, **overrides: Any
) -> Any:
    """The tiny random model (``AutoModel``) of ``model_type``, in eval mode, random biases
    (``overrides``: config fields to change)."""
    from transformers import AutoModel

    cfg = config(model_type, **overrides)
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg, attn_implementation=attn_implementation)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and p.dim() == 1:
                p.normal_(std=0.1)
    return model.eval()


def clone(model: Any) -> Any:
    """An independent copy of a model (its own weights and modules)."""
    return copy.deepcopy(model)


def inputs(model: Any, seq: int = 8) -> dict[str, torch.Tensor]:
    """Two rows of ``seq`` tokens (the second with 3 padded positions), decoder ids for an
    encoder-decoder, an image batch for a vision model, a spectrogram for Whisper."""
    import inspect

    cfg = model.config
    params = inspect.signature(model.forward).parameters
    gen = torch.Generator().manual_seed(1)
    batch: dict[str, torch.Tensor] = {}
    if "input_ids" in params:
        batch["input_ids"] = torch.randint(5, 1000, (2, seq), generator=gen)
        mask = torch.ones(2, seq, dtype=torch.long)
        mask[1, seq - 3 :] = 0
        batch["attention_mask"] = mask
    if "pixel_values" in params:
        size = (getattr(cfg, "vision_config", None) or cfg).image_size
        batch["pixel_values"] = torch.randn(2, 3, size, size, generator=gen)
    if "input_features" in params:
        frames = 2 * cfg.max_source_positions
        batch["input_features"] = torch.randn(2, cfg.num_mel_bins, frames, generator=gen)
        batch.pop("input_ids", None)
        batch.pop("attention_mask", None)
    if getattr(cfg, "is_encoder_decoder", False):
        batch["decoder_input_ids"] = torch.randint(5, 1000, (2, seq - 2), generator=gen)
    return batch
