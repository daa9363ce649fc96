"""Train small transformers on headlab's own attention (the one-head-versus-many experiment that
uses them: :mod:`headlab.experiments.one_vs_many`)."""

from headlab.training.model import (
    ModelConfig,
    TinyTransformer,
    load_checkpoint,
    save_checkpoint,
    to_gpt2,
)
from headlab.training.trainer import TrainConfig, train

__all__ = [
    "ModelConfig",
    "TinyTransformer",
    "TrainConfig",
    "load_checkpoint",
    "save_checkpoint",
    "to_gpt2",
    "train",
]
