"""Compression passes, one verb each: finetune, distill, prune, share, pretrain.

Each takes a model and data, is configured by a small dataclass, trains through the shared loop
in `train.py` (resumable from `work_dir`, seeded, DDP-ready), and returns `(model, Record)`.
"""

from .distill import DistillConfig, TeacherCache, distill, init_student
from .finetune import FinetuneConfig, finetune
from .pretrain import PretrainConfig, mlm_accuracy, pretrain, pretraining_data
from .prune import PruneConfig, importance, magnitude_prune, prune
from .share import ShareConfig, factorize_embeddings, share, share_layers, token_frequencies
from .surgery import remove_heads, remove_layers, remove_neurons
from .train import Objective, Record, TrainConfig, evaluate, measure, train

__all__ = ["DistillConfig", "FinetuneConfig", "Objective", "PretrainConfig", "PruneConfig", "Record", "ShareConfig",
           "TeacherCache", "TrainConfig", "distill", "evaluate", "factorize_embeddings", "finetune", "importance",
           "init_student", "magnitude_prune", "measure", "mlm_accuracy", "pretrain", "pretraining_data", "prune",
           "remove_heads", "remove_layers", "remove_neurons", "share", "share_layers", "token_frequencies", "train"]
