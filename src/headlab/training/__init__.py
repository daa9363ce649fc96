"""Train small transformers on headlab's own attention (the one-head-versus-many experiment that
uses them: :mod:`headlab.experiments.one_vs_many`)."""

from typing import TYPE_CHECKING

from headlab._lazy import attach

if TYPE_CHECKING:
    from headlab.training.model import ModelConfig as ModelConfig
    from headlab.training.model import TinyTransformer as TinyTransformer
    from headlab.training.model import load_checkpoint as load_checkpoint
    from headlab.training.model import save_checkpoint as save_checkpoint
    from headlab.training.model import to_gpt2 as to_gpt2
    from headlab.training.trainer import TrainConfig as TrainConfig
    from headlab.training.trainer import train as train

__getattr__, __dir__, __all__ = attach(__name__, __file__)
