"""static: a student with no attention and no layers, for budgets below the smallest transformer.

Its token vectors follow model2vec's recipe, taken from the task teacher rather than a general encoder: each
vocabulary token's vector is the teacher's last hidden state for it alone (`[CLS] token [SEP]`), cut to its first
`dim` principal components and weighted by SIF, a / (a + p(token)) with p counted on the training text
(model2vec's Zipf weighting, from counts instead of vocabulary rank). The student is an edgebert model with zero
layers: that word table, n-gram features over windows of tokens (Kim's sentence CNN, as one linear layer), a
mask-aware maximum, and the classifier. Distillation on the teacher's soft labels, over the training text and
word-swapped copies of it, then trains table and head together. A mean of the vectors with an MLP head
(model2vec's classifier) stopped near 82.5% on SST-2 dev here, with or without the copies; the windows with the
copies reached 84.9% (recipes/sst2-minilm-static.toml). Being an ordinary edgebert model, it goes through vocab,
quantize and export like any other student.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from ..config import Config
from ..data import TaskData
from ..errors import EdgebertError
from ..model import EncoderConfig, SequenceClassifier, TaskModel, build, check_ngrams, embeddings, encoder_of
from .augment import AugmentConfig
from .distill import DistillConfig, distill
from .share import token_frequencies
from .train import Result, TrainConfig

HEADS = ("sequence-classification",)  # context-free vectors have nothing to say per token


@dataclass(frozen=True, kw_only=True)
class StaticConfig(Config):
    """The static student's width and weighting, and the distillation that trains it."""

    dim: int = 96  # vector width: the teacher's token vectors' first `dim` principal components
    sif: float = 1e-3  # SIF's a; 0 weighs every token the same
    ngram_window: int = 3  # tokens each n-gram feature reads (odd)
    ngram_features: int = 256
    distill: DistillConfig = field(default_factory=lambda: DistillConfig(
        train=TrainConfig(steps=4000, batch_size=128, lr=5e-4, eval_every=500), augment=AugmentConfig(copies=4)))

    def __post_init__(self):
        if self.dim < 2:
            raise EdgebertError(f"StaticConfig.dim must be at least 2, got {self.dim}")
        check_ngrams(self.ngram_window, self.ngram_features, "StaticConfig")
        if self.sif < 0:
            raise EdgebertError(f"StaticConfig.sif must be ≥ 0 (0 = no weighting), got {self.sif}")
        if self.distill.makes_student or self.distill.hidden_weight or self.distill.attention_weight \
                or self.distill.value_weight:
            raise EdgebertError("static.distill trains the static student from its teacher's outputs alone: leave "
                                "layers, keep_layers, heads, ffn and the hidden, attention and value weights unset")

    def cached_in(self, root) -> "StaticConfig":
        """These options with the teacher-output cache under `root` (distill's own rule)."""
        return self.replace(distill=self.distill.cached_in(root))


def check_width(config: StaticConfig, hidden_size: int) -> None:
    """PCA keeps at most the teacher's width."""
    if config.dim > hidden_size:
        raise EdgebertError(f"static.dim {config.dim} is wider than the teacher's {hidden_size} hidden units: use at "
                            f"most {hidden_size}")


def check_tokenizer(tokenizer) -> None:
    """Each token is read alone between [CLS] and [SEP]."""
    if tokenizer is None or tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        given = "no tokenizer was given (TaskData(..., tokenizer=))" if tokenizer is None else \
            "this tokenizer lacks one"
        raise EdgebertError(f"a static student reads each token between [CLS] and [SEP], and {given}: use a tokenizer "
                            "with both, or drop \"static\" from stages")


@torch.no_grad()
def token_vectors(teacher: TaskModel, cls_id: int, sep_id: int, batch: int = 1024) -> torch.Tensor:
    """[V, H]: the teacher encoder's last hidden state of every vocabulary token, read alone between [CLS] and
    [SEP] (model2vec's per-token forward)."""
    encoder = encoder_of(teacher).eval()
    ids = torch.arange(encoder.config.vocab_size)
    rows = []
    for chunk in ids.split(batch):
        x = torch.stack([torch.full_like(chunk, cls_id), chunk, torch.full_like(chunk, sep_id)], 1)
        rows.append(encoder(x, torch.ones_like(x), torch.zeros_like(x))[:, 1].float())
    return torch.cat(rows)


def principal(vectors: torch.Tensor, dim: int) -> torch.Tensor:
    """The centred vectors on their first `dim` principal components, scaled to unit mean row norm."""
    centred = vectors.double() - vectors.double().mean(0)
    _, _, v = torch.linalg.svd(centred, full_matrices=False)
    reduced = centred @ v[:dim].T
    return (reduced / reduced.norm(dim=1).mean()).float()


def static_shape(teacher: nn.Module, config: StaticConfig) -> SequenceClassifier:
    """An untrained zero-layer student of `teacher`, with a fresh n-gram head of the teacher's labels."""
    if not isinstance(teacher, TaskModel) or teacher.head.kind not in HEADS:
        kind = teacher.head.kind if isinstance(teacher, TaskModel) else type(teacher).__name__
        raise EdgebertError(f"a static student pools a sentence's context-free token vectors into one, so it has no "
                            f"{kind} head: use it for {', '.join(HEADS)} tasks, or distill a transformer student")
    t = encoder_of(teacher).config
    check_width(config, t.hidden_size)
    shape = EncoderConfig(family=t.family, vocab_size=t.vocab_size, hidden_size=config.dim, num_layers=0, num_heads=1,
                          intermediate_size=0, embedding_layernorm=False, type_vocab_size=0, position="none",
                          max_positions=t.max_length, pad_token_id=t.pad_token_id, layer_norm_eps=t.layer_norm_eps,
                          dropout=0.0, attention_dropout=0.0)  # with the teacher's 0.1: 83.8% SST-2 dev, not 84.9
    return build(shape, replace(teacher.head, pooling="max", pooler=None, ngram_window=config.ngram_window,
                                ngram_features=config.ngram_features))


def static_student(teacher: TaskModel, data: TaskData, config: StaticConfig) -> SequenceClassifier:
    """`static_shape`'s student with the teacher's token vectors, reduced and weighted, as its word table (see the
    module docstring)."""
    student = static_shape(teacher, config)
    tokenizer = data.tokenizer
    check_tokenizer(tokenizer)
    table = principal(token_vectors(teacher, tokenizer.cls_token_id, tokenizer.sep_token_id), config.dim)
    if config.sif:
        counts = token_frequencies(teacher, data.train)[0]
        table = table * (config.sif / (config.sif + counts / counts.sum()))[:, None].float()
    embeddings(student).word.weight.data.copy_(table)
    return student


def static(model: nn.Module, config: StaticConfig, data: TaskData, *, teacher: nn.Module | None = None,
           work_dir: str | Path | None = None) -> Result:
    """A static student of `model` (the teacher), trained by distillation on its soft labels."""
    if teacher is not None:
        raise EdgebertError("static makes its student from the model it is given, which is the teacher: drop teacher=")
    model.eval()
    student = static_student(model, data, config)
    result = distill(student, config.distill, data, teacher=model, work_dir=work_dir, name="static")
    result.record.name = "static"
    result.record.details["static"] = {k: v for k, v in config.to_dict().items() if k != "distill"}
    return result

