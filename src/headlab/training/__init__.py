"""Train small transformers on headlab's own attention, and the one-head-versus-many experiment."""

from headlab.training.experiment import GridConfig, one_vs_many
from headlab.training.model import (
    ModelConfig,
    TinyTransformer,
    load_checkpoint,
    save_checkpoint,
    to_gpt2,
)
from headlab.training.trainer import TrainConfig, train

__all__ = [
    "GridConfig",
    "ModelConfig",
    "TinyTransformer",
    "TrainConfig",
    "load_checkpoint",
    "one_vs_many",
    "save_checkpoint",
    "to_gpt2",
    "train",
]
