"""Compression passes, one verb each: finetune, distill, prune, share, vocab, pretrain.

Every pass is `verb(model, config, data, *, teacher=None, work_dir=None) -> Result`: `data` is a
`TaskData`, `config` a small frozen dataclass, and `Result.model` / `Result.record` what it made
and what that costs. Each trains through the shared loop in `train.py` (resumable from `work_dir`,
seeded, DDP-ready).
"""

from .augment import AugmentConfig, augment
from .distill import DistillConfig, distill
from .finetune import FinetuneConfig, finetune
from .pretrain import PretrainConfig, mlm_accuracy, pretrain, pretraining_data
from .prune import PruneConfig, importance, magnitude_prune, prune
from .share import ShareConfig, factorize_embeddings, share, share_layers, token_frequencies
from .surgery import remove_heads, remove_layers, remove_neurons
from .teacher import TeacherCache
from .train import Objective, Record, Result, TrainConfig, evaluate, measure, train
from .vocab import VocabConfig, VocabResult, prune_vocab

__all__ = ["AugmentConfig", "DistillConfig", "FinetuneConfig", "Objective", "PretrainConfig", "PruneConfig", "Record", "Result",
           "ShareConfig", "TeacherCache", "TrainConfig", "augment", "distill", "evaluate", "factorize_embeddings", "finetune",
           "importance", "magnitude_prune", "measure", "mlm_accuracy", "pretrain", "pretraining_data", "prune",
           "remove_heads", "remove_layers", "remove_neurons", "share", "share_layers", "token_frequencies", "train",
           "VocabConfig", "VocabResult", "prune_vocab"]
