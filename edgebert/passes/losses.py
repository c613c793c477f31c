"""The distillation losses, in one place: soft logits (Hinton), sentence-vector cosine (an embedder's
output), attention (TinyBERT), value relation (MiniLM). quantize.qat's fake-quant fine-tuning uses the
same output loss (`output_loss`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import EdgebertError
from ..model import Embedder, attention_bias


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], n, -1).transpose(1, 2)


def _relation_kl(s: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) of row distributions [B, heads, T, T], mean over real query rows."""
    s_log = torch.log_softmax(s + attention_bias(mask, s.dtype), -1)
    t_log = torch.log_softmax(t + attention_bias(mask, t.dtype), -1)
    kl = (t_log.exp() * (t_log - s_log)).sum(-1)  # [B, heads, T]
    rows = mask[:, None, :].to(kl.dtype)
    return (kl * rows).sum() / (rows.sum() * kl.shape[1])


def attention_kl(s_q, s_k, t_q, t_k, s_heads, t_heads, mask) -> torch.Tensor:
    """TinyBERT's attention loss; with unequal head counts, the head-averaged distributions."""
    s = _heads(s_q, s_heads) @ _heads(s_k, s_heads).transpose(-1, -2) / math.sqrt(s_q.shape[-1] / s_heads)
    t = _heads(t_q, t_heads) @ _heads(t_k, t_heads).transpose(-1, -2) / math.sqrt(t_q.shape[-1] / t_heads)
    if s_heads == t_heads:
        return _relation_kl(s, t, mask)
    bias = attention_bias(mask, s.dtype)
    s_p = torch.softmax(s + bias, -1).mean(1, keepdim=True)
    t_p = torch.softmax(t + bias, -1).mean(1, keepdim=True)
    kl = (t_p * (t_p.clamp_min(1e-12).log() - s_p.clamp_min(1e-12).log())).sum(-1)
    rows = mask[:, None, :].to(kl.dtype)
    return (kl * rows).sum() / rows.sum()


def value_relation_kl(s_v, t_v, relation_heads: int, mask) -> torch.Tensor:
    """MiniLM's value-relation loss: split V into `relation_heads` and compare softmax(VVᵀ/√d)."""
    for v in (s_v, t_v):
        if v.shape[-1] % relation_heads:
            raise EdgebertError(f"value width {v.shape[-1]} is not divisible by relation_heads={relation_heads}: "
                                "pick a common divisor of the student's and teacher's widths")
    s, t = _heads(s_v, relation_heads), _heads(t_v, relation_heads)
    return _relation_kl(s @ s.transpose(-1, -2) / math.sqrt(s.shape[-1]),
                        t @ t.transpose(-1, -2) / math.sqrt(t.shape[-1]), mask)


def soft_loss(s: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t/T) ‖ softmax(s/T))·T² over the last dim, mean over rows; MSE for one output."""
    if s.shape[-1] == 1:
        return F.mse_loss(s, t)
    s_log, t_log = torch.log_softmax(s / temperature, -1), torch.log_softmax(t / temperature, -1)
    return (t_log.exp() * (t_log - s_log)).sum(-1).mean() * temperature**2


def cosine_loss(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """1 − cos(student, teacher) per sentence vector, mean over rows: vectors are matched by direction,
    as cosine search and the STS metric read them, so no labels are needed."""
    return (1 - F.cosine_similarity(s, t, dim=-1)).mean()


def output_loss(model: torch.nn.Module, s: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    """What a student's output is matched to its teacher's with: the cosine of an embedder's vectors,
    else the soft-logit loss."""
    return cosine_loss(s, t) if isinstance(model, Embedder) else soft_loss(s, t, temperature)
