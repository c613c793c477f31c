"""The BERT-family encoder in one file.

One readable implementation covers BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA, MiniLM, ModernBERT
and DeBERTa-v2/v3, plus everything the compression passes produce: per-layer head counts and FFN widths
(pruning), cross-layer sharing (ALBERT), a factorized embedding E < H, pre- or post-LN.

Three seams, each a module chosen by the config: the position (a learned table in `Embeddings`,
`Rotary` inside the attention, or DeBERTa's `RelativePositions` read by a `DisentangledSelfAttention`,
with or without the table), the attention span (global, or a `SlidingWindow` on some layers)
and the FFN (`Intermediate`, plain or gated). A BERT-layout config builds none of the optional
parts, so its graph is exactly the one ONNX Runtime's BERT fusions expect.

Submodule names follow Hugging Face's BERT (`embeddings.word_embeddings`,
`encoder.layer.0.attention.self.query`, ...), so BERT, MiniLM and ELECTRA checkpoints load by
stripping a prefix; each file of `edgebert.families` maps its family's names. Passes never spell
these paths: they address layers by role through the view at the bottom (`blocks`, `embeddings`)
and reach the encoder of any task model through `encoder_of`.

`forward` has no data-dependent Python control flow: the same code traces to ONNX and converts to
TFLite at fixed or variable sequence length. What only an exported graph does (the last layer for [CLS]
alone, ONNX Runtime's attention node, one LayerNormalization node per width-pruned norm) is no switch
here: `edgebert.export.graph` swaps wrappers of these modules into a copy of the model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .errors import EdgebertError

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}


# What a masked key's score gets added: e^-100 of the weight is none in any precision, and unlike finfo.min it
# leaves a full-integer file's score-plus-mask range (taken by calibration) room to resolve the scores.
MASKED = -100.0


@dataclass
class EncoderConfig:
    """Shape of an encoder. Defaults are MiniLM-L6-H384 (all-MiniLM-L6-v2)."""

    family: str = "bert"  # a registered edgebert.families name; MiniLM is "bert"
    vocab_size: int = 30522
    hidden_size: int = 384
    num_layers: int = 6
    num_heads: int = 12
    intermediate_size: int = 1536
    head_size: int | None = None  # hidden_size // num_heads unless set; pruning keeps it fixed
    layer_heads: list[int] | None = None  # heads per layer after pruning; None = num_heads each
    layer_ffn: list[int] | None = None  # FFN width per layer after pruning; None = intermediate_size
    attention_groups: list[int] | None = None  # layer i uses attention module attention_groups[i]
    ffn_groups: list[int] | None = None  # likewise for the FFN (ALBERT shares both)
    embedding_size: int | None = None  # E < H factorizes the embedding (ALBERT, ELECTRA-small)
    embedding_layernorm: bool = True
    pre_ln: bool = False  # BERT is post-LN; pre-LN adds a final LayerNorm
    activation: str = "gelu"  # exact GELU; "gelu_tanh" for ALBERT's gelu_new
    type_vocab_size: int = 2  # 0 = no segment embeddings (DistilBERT), 1 for RoBERTa
    max_positions: int = 512  # rows of the learned position table; the longest input when rotary
    position_offset: int = 0  # RoBERTa's positions start at padding_idx + 1 = 2
    position: str = "absolute"  # absolute (a learned table) | rotary (q and k rotated per position) | none
    rope_theta: float = 10000.0  # rotary base of global-attention layers
    local_rope_theta: float | None = None  # rotary base of sliding-window layers; None = rope_theta
    attention_window: int | None = None  # keys within ±window//2 only, except on every global_every-th layer
    global_every: int = 1  # layer i attends globally when i % global_every == 0
    gated_ffn: bool = False  # FFN act(W x) ⊙ (G x) (GeGLU with GELU; ModernBERT) instead of act(W x)
    bias: bool = True  # biases of the encoder's Linear and LayerNorm layers (ModernBERT has none)
    first_attention_norm: bool = True  # pre-LN: False leaves layer 0 to the embedding LayerNorm (ModernBERT)
    relative_terms: list[str] | None = None  # DeBERTa's disentangled attention: "c2p" and/or "p2c"; None = none
    relative_buckets: int = 0  # log-bucketed distances (DeBERTa's position_buckets); 0 = exact distances
    max_relative_positions: int = 512  # the farthest distance told apart (clamped beyond; the log scale's end)
    relative_shared_key: bool = False  # position terms reuse the query and key projections (share_att_key)
    relative_norm: bool = False  # LayerNorm on the relative position table (norm_rel_ebd="layer_norm")
    norm_width: int | None = None  # width pruning: hidden-width LayerNorms average over this pre-pruning width
    pad_token_id: int = 0
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1
    attention_dropout: float = 0.1

    def __post_init__(self):
        if self.head_size is None:
            if self.hidden_size % self.num_heads:
                raise EdgebertError(
                    f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}: "
                    "set head_size explicitly"
                )
            self.head_size = self.hidden_size // self.num_heads
        if self.activation not in ACTIVATIONS:
            raise EdgebertError(f"unknown activation {self.activation!r}: use one of {sorted(ACTIVATIONS)}")
        if self.position not in ("absolute", "rotary", "none"):
            raise EdgebertError(f"unknown position {self.position!r}: use 'absolute', 'rotary' or 'none'")
        if self.relative_terms is not None and (not self.relative_terms or set(self.relative_terms) - {"c2p", "p2c"}):
            raise EdgebertError(f"relative_terms {self.relative_terms!r}: use a non-empty subset of ['c2p', 'p2c'], "
                                "or None for no relative attention")
        if self.relative_buckets < 0 or self.max_relative_positions < 1:
            raise EdgebertError(f"relative_buckets {self.relative_buckets} must be ≥ 0 and max_relative_positions "
                                f"{self.max_relative_positions} ≥ 1")
        if self.position == "rotary" and self.head_size % 2:
            raise EdgebertError(f"rotary positions rotate pairs of dimensions: head_size {self.head_size} must be even")
        if self.global_every < 1:
            raise EdgebertError(f"global_every must be ≥ 1, got {self.global_every}")
        for name in ("layer_heads", "layer_ffn", "attention_groups", "ffn_groups"):
            value = getattr(self, name)
            if value is not None and len(value) != self.num_layers:
                raise EdgebertError(f"{name} has {len(value)} entries for {self.num_layers} layers")
        for groups, widths in (("attention_groups", self.heads), ("ffn_groups", self.ffn)):
            seen: dict[int, int] = {}
            for i in range(self.num_layers):
                g = self.group(groups, i)
                if seen.setdefault(g, widths(i)) != widths(i):
                    raise EdgebertError(f"{groups}: layers sharing group {g} must have the same width")

    @property
    def max_length(self) -> int:
        """The longest input the position table allows."""
        return self.max_positions - self.position_offset

    @property
    def embedding_dim(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def relative_span(self) -> int:
        """Half the rows of the relative position table: distances −span..span−1 get their own row."""
        return self.relative_buckets or self.max_relative_positions

    def heads(self, i: int) -> int:
        return self.layer_heads[i] if self.layer_heads else self.num_heads

    def ffn(self, i: int) -> int:
        return self.layer_ffn[i] if self.layer_ffn else self.intermediate_size

    def window(self, i: int) -> int | None:
        """Layer i's sliding attention window, or None when it attends globally."""
        return None if self.attention_window is None or i % self.global_every == 0 else self.attention_window

    def group(self, kind: str, i: int) -> int:
        groups = getattr(self, kind)
        return groups[i] if groups else i

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        known = cls.__dataclass_fields__
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise EdgebertError(f"unknown encoder config keys {unknown}: the file was written by a newer edgebert")
        return cls(**d)


class Embeddings(nn.Module):
    """token + segment + learned position embeddings (absolute positions only), LayerNorm, and the
    E→H projection if factorized."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.embedding_dim, padding_idx=c.pad_token_id)
        absolute = c.position == "absolute"
        self.position_embeddings = nn.Embedding(c.max_positions, c.embedding_dim) if absolute else None
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.embedding_dim) if c.type_vocab_size else None
        self.LayerNorm = _norm(c, c.embedding_dim, hidden=c.embedding_size is None) if c.embedding_layernorm else None
        self.dropout = nn.Dropout(c.dropout)
        self.projection = nn.Linear(c.embedding_dim, c.hidden_size) if c.embedding_dim != c.hidden_size else None
        if absolute:
            self.register_buffer("position_ids", torch.arange(c.max_positions).unsqueeze(0), persistent=False)
        self.offset = c.position_offset

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(self.position_ids[:, self.offset : self.offset + seq_len])
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        x = self.dropout(x)
        return self.projection(x) if self.projection is not None else x


class Rotary(nn.Module):
    """Rotary positions: each pair (i, i + d/2) of a head's q and k turned by position · θ^(−2i/d)."""

    def __init__(self, head_size: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, d] rotated by its positions 0..T-1."""
        positions = torch.arange(x.shape[2], dtype=torch.float32, device=x.device)
        angles = torch.outer(positions, self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * angles.cos().to(x.dtype) + rotated * angles.sin().to(x.dtype)


class SlidingWindow(nn.Module):
    """Local attention: keys farther than window // 2 positions from the query are masked out."""

    def __init__(self, window: int):
        super().__init__()
        self.reach = window // 2

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """The key mask [B, 1, 1, T] → [B, 1, T, T] with the far keys of each query masked too."""
        positions = torch.arange(mask.shape[-1], device=mask.device)
        far = (positions[None, :] - positions[:, None]).abs() > self.reach
        return mask.masked_fill(far, MASKED)


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention, written like HF's eager BertSelfAttention so that ONNX Runtime's
    BERT fusions recognise the exported graph. Layer `index` picks its seams."""

    def __init__(self, c: EncoderConfig, heads: int, index: int):
        super().__init__()
        self.heads, self.head_size = heads, c.head_size
        inner = heads * c.head_size
        self.query = nn.Linear(c.hidden_size, inner, bias=c.bias)
        self.key = nn.Linear(c.hidden_size, inner, bias=c.bias)
        self.value = nn.Linear(c.hidden_size, inner, bias=c.bias)
        self.dropout = nn.Dropout(c.attention_dropout)
        window = c.window(index)
        self.window = SlidingWindow(window) if window is not None else None
        theta = c.local_rope_theta if window is not None and c.local_rope_theta is not None else c.rope_theta
        self.rotary = Rotary(c.head_size, theta) if c.position == "rotary" else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split(t) for t in (self.query(x), self.key(x), self.value(x)))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if self.window is not None:
            mask = self.window(mask)
        return attend(q, k, v, mask, self.head_size, self.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return split_heads(x, self.heads, self.head_size)


def split_heads(x: torch.Tensor, heads: int, size: int) -> torch.Tensor:
    """[B, T, heads·size] → [B, heads, T, size]; the sizes are ints, so a traced graph holds them as constants."""
    return x.view(x.shape[0], -1, heads, size).permute(0, 2, 1, 3)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, size: int,
           dropout: nn.Module | None = None) -> torch.Tensor:
    """softmax(q·kᵀ/√size + mask)·v for q [B, heads, S, size] and k, v [B, heads, T, size]: the context
    [B, S, heads·size]."""
    probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(size) + mask, dim=-1)
    context = torch.matmul(dropout(probs) if dropout is not None else probs, v).permute(0, 2, 1, 3).contiguous()
    return context.view(q.shape[0], -1, context.shape[2] * size)


def _bucket(distance: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """DeBERTa's log buckets of signed distances: exact within ±buckets//2, log-spaced out to max_distance.
    Computed once at build time, as transformers does it, so no runtime's log rounds a bucket differently."""
    if not buckets:
        return distance
    mid = buckets // 2
    near = (distance < mid) & (distance > -mid)
    far = torch.where(near, torch.tensor(mid - 1), distance.abs())
    log = torch.ceil(torch.log(far / mid) / torch.log(torch.tensor((max_distance - 1) / mid)) * (mid - 1)) + mid
    return torch.where(far <= mid, distance.to(log.dtype), log * torch.sign(distance)).long()


class RelativePositions(nn.Module):
    """DeBERTa's relative positions, shared by all layers: the table of 2·span position embeddings
    (LayerNorm'd if `relative_norm`) and, for a length T, which table row each query–key pair reads."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        span = c.relative_span
        self.table = nn.Embedding(2 * span, c.hidden_size)
        self.LayerNorm = _norm(c, c.hidden_size, hidden=True) if c.relative_norm else None
        self.reach = c.max_positions - 1
        distance = torch.arange(-self.reach, self.reach + 1)  # query position − key position
        rows = (_bucket(distance, c.relative_buckets, c.max_relative_positions) + span).clamp(0, 2 * span - 1)
        self.register_buffer("rows", rows, persistent=False)

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(table [2·span, H], rows [T, T]: the row of query i and key j)."""
        positions = torch.arange(length, device=self.rows.device)
        table = self.table.weight
        table = self.LayerNorm(table) if self.LayerNorm is not None else table
        return table, self.rows[positions[:, None] - positions[None, :] + self.reach]


class DisentangledSelfAttention(SelfAttention):
    """DeBERTa's attention: content scores q·k plus content-to-position (c2p: the query against the key
    projection of the pair's relative position) and position-to-content (p2c: the key against its query
    projection), all over √(head_size · (1 + terms)). Own position projections unless `relative_shared_key`."""

    def __init__(self, c: EncoderConfig, heads: int, index: int):
        super().__init__(c, heads, index)
        self.terms = tuple(c.relative_terms)
        self.scale = math.sqrt(c.head_size * (1 + len(self.terms)))
        inner, own = heads * c.head_size, not c.relative_shared_key
        self.pos_key = nn.Linear(c.hidden_size, inner, bias=c.bias) if own and "c2p" in self.terms else None
        self.pos_query = nn.Linear(c.hidden_size, inner, bias=c.bias) if own and "p2c" in self.terms else None
        self.pos_dropout = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2))
        table = self.pos_dropout(table)[None]  # [1, 2·span, H]
        if "c2p" in self.terms:
            pos_key = self.split((self.key if self.pos_key is None else self.pos_key)(table))
            c2p = torch.matmul(q, pos_key.transpose(-1, -2))  # [B, heads, T, 2·span]
            scores = scores + torch.gather(c2p, -1, rows.expand_as(scores))
        if "p2c" in self.terms:
            pos_query = self.split((self.query if self.pos_query is None else self.pos_query)(table))
            p2c = torch.matmul(k, pos_query.transpose(-1, -2))  # [B, heads, T (keys), 2·span]
            scores = scores + torch.gather(p2c, -1, rows.T.expand_as(scores)).transpose(-1, -2)
        probs = self.dropout(torch.softmax(scores / self.scale + mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(x.shape[0], x.shape[1], self.heads * self.head_size)


class Projection(nn.Module):
    """dense + dropout + residual LayerNorm: BERT's `attention.output` and `output` blocks. Pre-LN,
    the LayerNorm normalises the block's input instead (None: the input comes normalised)."""

    def __init__(self, c: EncoderConfig, width: int, norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(width, c.hidden_size, bias=c.bias)
        self.LayerNorm = _norm(c, c.hidden_size, hidden=True) if norm else None
        self.dropout = nn.Dropout(c.dropout)


class Attention(nn.Module):
    def __init__(self, c: EncoderConfig, heads: int, index: int):
        super().__init__()
        self.self = (DisentangledSelfAttention if c.relative_terms else SelfAttention)(c, heads, index)
        self.output = Projection(c, heads * c.head_size, norm=index > 0 or c.first_attention_norm)


class Intermediate(nn.Module):
    """The FFN's first half: act(W x), or act(W x) ⊙ (G x) when gated (GeGLU with GELU)."""

    def __init__(self, c: EncoderConfig, width: int):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, width, bias=c.bias)
        self.gate = nn.Linear(c.hidden_size, width, bias=c.bias) if c.gated_ffn else None
        self.act = ACTIVATIONS[c.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.dense(x))
        return h * self.gate(x) if self.gate is not None else h


class Layer(nn.Module):
    """One transformer block. Its attention and FFN modules may be shared with other layers."""

    def __init__(self, attention: Attention, intermediate: Intermediate, output: Projection, pre_ln: bool):
        super().__init__()
        self.attention, self.intermediate, self.output = attention, intermediate, output
        self.pre_ln = pre_ln

    def forward(self, x: torch.Tensor, mask: torch.Tensor, *relative: torch.Tensor) -> torch.Tensor:
        """`relative`: RelativePositions' (table, rows) for DeBERTa's attention, else nothing."""
        attn, out = self.attention.output, self.output
        if self.pre_ln:
            h = attn.LayerNorm(x) if attn.LayerNorm is not None else x
            x = x + attn.dropout(attn.dense(self.attention.self(h, mask, *relative)))
            return x + out.dropout(out.dense(self.intermediate(out.LayerNorm(x))))
        x = attn.LayerNorm(attn.dropout(attn.dense(self.attention.self(x, mask, *relative))) + x)
        return out.LayerNorm(out.dropout(out.dense(self.intermediate(x))) + x)


class Stack(nn.Module):
    """`encoder.layer[i]`; layers in one sharing group hold the same module objects."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        attentions: dict[int, Attention] = {}
        ffns: dict[int, tuple[Intermediate, Projection]] = {}
        layers = []
        for i in range(c.num_layers):
            a = attentions.get(c.group("attention_groups", i))
            if a is None:
                a = attentions[c.group("attention_groups", i)] = Attention(c, c.heads(i), i)
            f = ffns.get(c.group("ffn_groups", i))
            if f is None:
                f = ffns[c.group("ffn_groups", i)] = (Intermediate(c, c.ffn(i)), Projection(c, c.ffn(i)))
            layers.append(Layer(a, f[0], f[1], c.pre_ln))
        self.layer = nn.ModuleList(layers)
        self.final_layernorm = _norm(c, c.hidden_size, hidden=True) if c.pre_ln else None
        self.relative = RelativePositions(c) if c.relative_terms else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        relative = () if self.relative is None else self.relative(x.shape[1])
        for layer in self.layer:
            x = layer(x, mask, *relative)
        return self.final_layernorm(x) if self.final_layernorm is not None else x


class Encoder(nn.Module):
    """`(input_ids, attention_mask, token_type_ids) -> last hidden states [B, T, H]`."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Stack(config)
        self.apply(_init_weights)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # Eager calls only: a data-dependent refusal has no place in a graph, and this is the entry point of every
        # trace, an exporter's (edgebert's or the caller's own torch.onnx.export) as well as torch.compile's.
        if not (torch.jit.is_tracing() or torch.compiler.is_compiling()):
            input_ids, attention_mask, token_type_ids = as_inputs(input_ids, attention_mask, token_type_ids)
            check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        return self.encoder(x, attention_bias(attention_mask, x.dtype))


INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def as_inputs(*inputs) -> tuple[torch.Tensor | None, ...]:
    """The forward's inputs as tensors: numpy arrays and lists of rows become tensors, as a library user expects of
    a model, and `check_inputs` then judges their dtype and shape; a tensor or None passes as it is."""
    return tuple(t if t is None or isinstance(t, torch.Tensor) else _as_tensor(name, t)
                 for name, t in zip(INPUT_NAMES, inputs))


def _as_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, (np.ndarray, list, tuple)):
        raise EdgebertError(f"{name} is a {type(value).__name__}: pass a torch tensor, a numpy array or a list of "
                            "rows of token ids (tokenize text first)")
    try:
        array = np.asarray(value)
    except ValueError as e:  # numpy's word for rows of different lengths
        raise EdgebertError(f"{name} is a {type(value).__name__} that is not one array ({e}): pad its rows to one "
                            "length (attention_mask 0 on the padding)") from None
    if array.dtype.kind == "u":  # tokenizers' uint32 ids: torch reads few ops on unsigned types
        array = array.astype(np.int64)
    if array.dtype.kind not in "biuf":
        raise EdgebertError(f"{name} holds {array.dtype} values: pass numbers (token ids; 1 and 0 for the mask)")
    return torch.tensor(array)


def check_inputs(config: EncoderConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Refuse inputs the forward would otherwise broadcast, index out of range or answer from nothing."""
    for name, t in zip(INPUT_NAMES, (input_ids, attention_mask, token_type_ids)):
        if t is None:
            continue
        if name != "attention_mask" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise EdgebertError(f"{name} has dtype {t.dtype}: pass integer ids ({name}.long())")
    if input_ids.dim() != 2:
        raise EdgebertError(f"input_ids has shape {tuple(input_ids.shape)}: pass a [batch, tokens] tensor "
                            "(add a batch dimension with input_ids[None])")
    if input_ids.shape[1] > config.max_length:
        raise EdgebertError(f"input of {input_ids.shape[1]} tokens exceeds the model's {config.max_length} "
                            "positions: truncate it (max_length) before calling the model")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise EdgebertError(f"{name} has shape {tuple(t.shape)} but input_ids {tuple(input_ids.shape)}: pass "
                                f"one {name} row per input_ids row, of the same length")
    if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= config.vocab_size):
        bad = int(input_ids.min()) if input_ids.min() < 0 else int(input_ids.max())
        raise EdgebertError(f"input_ids holds id {bad}, outside the model's vocabulary 0..{config.vocab_size - 1}: "
                            "tokenize with the model's own tokenizer")
    if attention_mask is not None:
        soft = (attention_mask != 0) & (attention_mask != 1)
        if soft.any():  # a soft mask would weight keys by log(value), which no exported file reproduces
            raise EdgebertError(f"attention_mask holds {attention_mask[soft][0].item()}: pass 1 for each token and "
                                "0 for padding")
        empty = (attention_mask == 0).all(dim=1).nonzero()
        if len(empty):
            raise EdgebertError(f"attention_mask row {int(empty[0])} is all zeros, so the model would answer from "
                                "no token at all: give every row at least one real token (mask 1), or drop the row")


def attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask [B, 1, 1, T] over keys only: bidirectional, no causal part."""
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * MASKED


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose mean and variance may average over `stats_width` > its own width.

    Width pruning removes hidden units; counting them as the zeros they would be keeps the
    statistics of the unpruned model, so removing units that carried zeros changes nothing (and
    removing small ones changes little, where renormalising over fewer units would rescale all)."""

    def __init__(self, width: int, *, eps: float, bias: bool, stats_width: int | None = None):
        super().__init__(width, eps=eps, bias=bias)
        self.stats_width = stats_width if stats_width not in (None, width) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stats_width is None:
            return super().forward(x)
        kept = x.shape[-1] / self.stats_width
        mean = x.mean(-1, keepdim=True) * kept
        centred = x - mean
        variance = centred.pow(2).mean(-1, keepdim=True) * kept + (1 - kept) * mean * mean
        y = centred * torch.rsqrt(variance + self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


def _norm(c: EncoderConfig, width: int, *, hidden: bool = False, bias: bool | None = None) -> LayerNorm:
    """A LayerNorm of `width`; one at the hidden width (`hidden`) keeps the pre-pruning statistics."""
    return LayerNorm(width, eps=c.layer_norm_eps, bias=c.bias if bias is None else bias,
                     stats_width=c.norm_width if hidden else None)


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


# ---------------------------------------------------------------------------------------------
# Heads. Each task model holds `encoder` (an Encoder) and its head, and saves both.


@dataclass
class HeadConfig:
    """What sits on top of the encoder. `kind` picks the task model class."""

    kind: str = "sequence-classification"  # | token-classification | embedding | masked-lm
    num_labels: int = 2  # 1 = regression (STS-B)
    labels: list[str] = field(default_factory=list)
    pooler: str | None = "tanh"  # [CLS] dense + activation before the classifier; None = none
    pooler_bias: bool = True  # the bias of that dense (and of the MLM transform); ModernBERT has none
    pooler_norm: bool = False  # a LayerNorm after the pooler's activation (ModernBERT's head)
    pooling: str = "cls"  # embedding and sequence-classification: "cls" | "mean" | "max" (both mask-aware)
    ngram_window: int = 0  # > 0: n-gram features over this many tokens (odd) before pooling; a static student's
    ngram_features: int = 0  # how many: the pooled width
    normalize: bool = False  # embedding: L2-normalise
    vector_width: int | None = None  # embedding: a linear map from the hidden width to vectors this wide (width
                                     # pruning keeps the teacher's vectors through it)
    nsp: bool = False  # masked-lm: add BERT's next-sentence head

    @classmethod
    def from_dict(cls, d: dict) -> "HeadConfig":
        return cls(**d)


class TaskModel(nn.Module):
    """Base of the task models: an encoder, a head config, and saving/loading."""

    pools = False  # whether the output is `pooled`'s (sentence-level heads), not per token

    def __init__(self, config: EncoderConfig, head: HeadConfig):
        super().__init__()
        self.config, self.head = config, head
        self.encoder = Encoder(config)
        self.ngrams = Ngrams(config.hidden_size, head.ngram_window, head.ngram_features) if head.ngram_window \
            else None

    @property
    def pooled_width(self) -> int:
        return self.head.ngram_features if self.ngrams is not None else self.config.hidden_size

    def pooled(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        """The encoder's output (through the n-gram features, when the head has them) pooled as `head.pooling`
        says (the mask as a tensor, which `pool` reads too)."""
        input_ids, attention_mask, token_type_ids = as_inputs(input_ids, attention_mask, token_type_ids)
        x = self.encoder(input_ids, attention_mask, token_type_ids)
        if self.ngrams is not None:
            x = self.ngrams(x, torch.ones_like(input_ids) if attention_mask is None else attention_mask)
        return pool(x, attention_mask, self.head.pooling)

    @property
    def reads_cls_alone(self) -> bool:
        """Whether the output reads the last hidden states' [CLS] row and no other, so that an exported graph
        may compute that row alone in the last layer."""
        return self.pools and self.head.pooling == "cls"


def check_ngrams(window: int, features: int, where: str) -> None:
    """An n-gram window is odd, so each token's features are centred on it and the length stays."""
    if window < 1 or window % 2 == 0 or features < 1:
        raise EdgebertError(f"{where}.ngram_window must be odd (3 reads a token and its two neighbours) and "
                            f"ngram_features ≥ 1, got {window} and {features}")


class Ngrams(nn.Module):
    """Features of every window of `window` tokens (Kim's sentence CNN: the window's vectors side by side, through
    one linear layer, then ReLU), so that a model with no attention still reads "not good" apart from "good".
    Padding rows are zeroed first: a token at a sentence's end sees zeros beyond it however far the batch is
    padded. The window is a MatMul, not a Conv1d: ONNX Runtime's ConvInteger took 0.15 ms of a 0.17 ms static
    student, its DynamicQuantizeMatMul about a tenth of that."""

    def __init__(self, width: int, window: int, features: int):
        super().__init__()
        check_ngrams(window, features, "HeadConfig")
        self.window = window
        self.linear = nn.Linear(window * width, features)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        side = self.window // 2
        padded = F.pad(x, (0, 0, side, side))
        # ends counted from the back are constants, so the exported graph does no shape arithmetic per call
        windows = torch.cat([padded[:, i : (i - self.window + 1) or None] for i in range(self.window)], dim=-1)
        return F.relu(self.linear(windows))


class Pooler(nn.Module):
    """[CLS] → dense → activation (→ LayerNorm): BERT's pooler, RoBERTa/ELECTRA's classifier.dense,
    DistilBERT's pre_classifier, ModernBERT's head, DeBERTa's ContextPooler."""

    def __init__(self, c: EncoderConfig, activation: str, bias: bool = True, norm: bool = False):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.norm = _norm(c, c.hidden_size, hidden=True) if norm else None

    def forward(self, cls_state: torch.Tensor) -> torch.Tensor:
        x = self.act(self.dense(cls_state))
        return self.norm(x) if self.norm is not None else x


def pool(x: torch.Tensor, attention_mask: torch.Tensor | None, how: str) -> torch.Tensor:
    """[B, T, H] → [B, H]: the first ([CLS]) token, or the mean or the maximum over real tokens."""
    if how == "cls":
        return x[:, 0]
    if attention_mask is None:
        return x.mean(1) if how == "mean" else x.amax(1)
    if how == "max":
        return x.masked_fill(attention_mask.unsqueeze(-1) == 0, float("-inf")).amax(1)
    m = attention_mask.unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)


class SequenceClassifier(TaskModel):
    """Sentence and sentence-pair classification, and regression (num_labels=1), from [CLS]."""

    pools = True

    def __init__(self, config: EncoderConfig, head: HeadConfig):
        super().__init__(config, head)
        if head.pooling not in ("cls", "mean", "max"):
            raise EdgebertError(f"HeadConfig.pooling must be 'cls', 'mean' or 'max', got {head.pooling!r}")
        if head.pooler and self.ngrams is not None:
            raise EdgebertError("HeadConfig: n-gram features are the head's nonlinearity; set pooler = None with them")
        self.pooler = Pooler(config, head.pooler, head.pooler_bias, head.pooler_norm) if head.pooler else None
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(self.pooled_width, head.num_labels)
        for m in (self.pooler, self.classifier):
            if m is not None:
                m.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        x = self.pooled(input_ids, attention_mask, token_type_ids)
        if self.pooler is not None:
            x = self.pooler(x)
        return self.classifier(self.dropout(x))


class TokenClassifier(TaskModel):
    """One label per token (NER): logits [B, T, num_labels]."""

    def __init__(self, config: EncoderConfig, head: HeadConfig):
        super().__init__(config, head)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden_size, head.num_labels)
        self.classifier.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        return self.classifier(self.dropout(self.encoder(input_ids, attention_mask, token_type_ids)))


class Embedder(TaskModel):
    """Sentence embeddings: [CLS] or mask-aware mean pooling, through `projection` where the head has a
    `vector_width`, optionally L2-normalised."""

    pools = True

    def __init__(self, config: EncoderConfig, head: HeadConfig):
        super().__init__(config, head)
        self.projection = nn.Linear(config.hidden_size, head.vector_width, bias=False) if head.vector_width else None

    @property
    def vector_width(self) -> int:
        """How wide its vectors are: the projection's output, else the hidden width."""
        return self.head.vector_width or self.config.hidden_size

    def keep_vector_width(self) -> None:
        """Give the model a `projection` that is the identity, if it has none, so that narrowing the hidden width
        narrows its input columns and leaves the vectors as wide as the teacher's: the units that stay land where
        they were, the ones removed read as zeros."""
        if self.projection is None:
            width = self.config.hidden_size
            self.head = replace(self.head, vector_width=width)
            self.projection = nn.Linear(width, width, bias=False)
            with torch.no_grad():
                self.projection.weight.copy_(torch.eye(width))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        x = self.pooled(input_ids, attention_mask, token_type_ids)
        if self.projection is not None:
            x = self.projection(x)
        return F.normalize(x, dim=-1) if self.head.normalize else x


class MaskedLM(TaskModel):
    """MLM head tied to the word embeddings (+ optional NSP head on the pooled [CLS]).

    Returns MLM logits [B, T, V], or (MLM logits, NSP logits [B, 2]) when `head.nsp`."""

    def __init__(self, config: EncoderConfig, head: HeadConfig):
        super().__init__(config, head)
        e = config.embedding_dim
        self.transform = nn.Linear(config.hidden_size, e, bias=head.pooler_bias)
        self.act = ACTIVATIONS[config.activation]
        self.LayerNorm = _norm(config, e, hidden=config.embedding_size is None)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.pooler = Pooler(config, "tanh") if head.nsp else None
        self.nsp = nn.Linear(config.hidden_size, 2) if head.nsp else None
        for m in (self.transform, self.pooler, self.nsp):
            if m is not None:
                m.apply(_init_weights)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        x = self.encoder(input_ids, attention_mask, token_type_ids)
        h = self.LayerNorm(self.act(self.transform(x)))
        mlm = h @ self.encoder.embeddings.word_embeddings.weight.T + self.bias  # tied decoder
        if self.nsp is None:
            return mlm
        return mlm, self.nsp(self.pooler(x[:, 0]))


TASK_MODELS: dict[str, type[TaskModel]] = {
    "sequence-classification": SequenceClassifier,
    "token-classification": TokenClassifier,
    "embedding": Embedder,
    "masked-lm": MaskedLM,
}


def build(config: EncoderConfig, head: HeadConfig | None = None) -> nn.Module:
    """A fresh model: the bare Encoder when `head` is None, else the task model for `head.kind`."""
    if head is None:
        return Encoder(config)
    if head.kind not in TASK_MODELS:
        raise EdgebertError(f"unknown head kind {head.kind!r}: use one of {sorted(TASK_MODELS)}")
    return TASK_MODELS[head.kind](config, head)


def with_head(model: nn.Module, head: HeadConfig) -> TaskModel:
    """A task model with `head` on `model`'s encoder: the pretrained weights kept, the head fresh."""
    encoder = encoder_of(model)
    task_model = build(encoder.config, head)
    task_model.encoder.load_state_dict(encoder.state_dict())
    return task_model


def describe(model: nn.Module) -> dict:
    """The JSON that `save` writes under the "edgebert" key of config.json."""
    d = {"encoder": encoder_of(model).config.to_dict()}
    if isinstance(model, TaskModel):
        d["head"] = asdict(model.head)
    return d


def from_description(d: dict) -> nn.Module:
    head = HeadConfig.from_dict(d["head"]) if "head" in d else None
    return build(EncoderConfig.from_dict(d["encoder"]), head)


# ---------------------------------------------------------------------------------------------
# The layer view. Passes address an encoder's parts by role through it, never by module path, so
# a new layer layout changes only this file.


def encoder_of(model: nn.Module) -> Encoder:
    """The Encoder of an edgebert model: the model itself when bare, else the task model's."""
    if isinstance(model, Encoder):
        return model
    if isinstance(model, TaskModel):
        return model.encoder
    raise EdgebertError(f"{type(model).__name__} is not an edgebert model: load it with edgebert.load "
                        "or make one with edgebert.build")


def config_of(model: nn.Module) -> EncoderConfig | None:
    """The EncoderConfig of an edgebert model; None for any other module (the exporters take both)."""
    return encoder_of(model).config if isinstance(model, (Encoder, TaskModel)) else None


class _Part:
    """One role of a view, bound to a module path: reading gives the module (None where this layout has
    no such part), assigning replaces it."""

    def __init__(self, path: str):
        *self.parents, self.name = path.split(".")

    def _parent(self, view) -> nn.Module:
        module = view.module
        for name in self.parents:
            module = getattr(module, name)
        return module

    def __get__(self, view, owner=None):
        return self if view is None else getattr(self._parent(view), self.name, None)

    def __set__(self, view, module: nn.Module | None) -> None:
        setattr(self._parent(view), self.name, module)


class Block:
    """Layer `index` of an encoder (`module`), by role. Assigning a role replaces that module."""

    query = _Part("attention.self.query")
    key = _Part("attention.self.key")
    value = _Part("attention.self.value")
    attention_out = _Part("attention.output.dense")
    attention_norm = _Part("attention.output.LayerNorm")  # None where pre-LN layer 0 has none
    ffn_in = _Part("intermediate.dense")
    ffn_gate = _Part("intermediate.gate")  # None unless the FFN is gated
    pos_key = _Part("attention.self.pos_key")  # DeBERTa's own position projections, sliced by head like
    pos_query = _Part("attention.self.pos_query")  # key and query; None where absent or shared
    ffn_out = _Part("output.dense")
    ffn_norm = _Part("output.LayerNorm")
    # What layers that share "attention" or "ffn" hold in common (the modules `units` hands over).
    _UNITS = {"attention": ("attention",), "ffn": ("intermediate", "output")}

    def __init__(self, index: int, module: Layer):
        self.index, self.module = index, module

    @property
    def heads(self) -> int:
        return self.module.attention.self.heads

    @heads.setter
    def heads(self, n: int) -> None:
        self.module.attention.self.heads = n

    def units(self, kind: str) -> dict[str, nn.Module]:
        """The modules this layer shares with others when sharing `kind` ("attention" | "ffn")."""
        return {name: getattr(self.module, name) for name in self._UNITS[kind]}

    def set_units(self, units: dict[str, nn.Module]) -> None:
        """Make this layer use `units` (from `units()` of this or another layer)."""
        for name, module in units.items():
            setattr(self.module, name, module)


class EmbeddingParts:
    """The embeddings (`module`) by role; all but `word` may be None (`position` with rotary positions)."""

    word = _Part("word_embeddings")
    position = _Part("position_embeddings")
    token_type = _Part("token_type_embeddings")
    norm = _Part("LayerNorm")
    projection = _Part("projection")

    def __init__(self, module: Embeddings):
        self.module = module


def blocks(model: nn.Module) -> list[Block]:
    """The layers of `model`'s encoder in order; layers that share modules return the same ones."""
    return [Block(i, layer) for i, layer in enumerate(encoder_of(model).encoder.layer)]


def embeddings(model: nn.Module) -> EmbeddingParts:
    return EmbeddingParts(encoder_of(model).embeddings)


def keep_layers(model: nn.Module, kept: list[int]) -> None:
    """Keep only layers `kept` (0-based, in that order) of `model`'s encoder; the config is the caller's."""
    stack = encoder_of(model).encoder
    stack.layer = nn.ModuleList([stack.layer[i] for i in kept])


def hidden_parts(model: nn.Module) -> list[tuple[nn.Module, tuple[int, ...]]]:
    """Every module that reads or writes the hidden width, each once, with the weight dims that carry it
    (Linear: 0 = output rows, 1 = input columns; Embedding: 1; LayerNorm: 0): what width pruning narrows.
    A factorized embedding keeps its width E; only its projection's outputs are hidden."""
    encoder = encoder_of(model)
    emb, stack = embeddings(model), encoder.encoder
    factorized = emb.projection is not None
    ins, outs, both = [], [], []
    if factorized:
        outs.append(emb.projection)
    else:
        ins += [emb.word, emb.position, emb.token_type]
        outs.append(emb.norm)
    if stack.relative is not None:  # DeBERTa's table of position embeddings, read through the projections
        ins.append(stack.relative.table)
        outs.append(stack.relative.LayerNorm)
    for b in blocks(model):
        attention = b.module.attention.self
        ins += [b.query, b.key, b.value, b.ffn_in, b.ffn_gate, getattr(attention, "pos_key", None),
                getattr(attention, "pos_query", None)]
        outs += [b.attention_out, b.attention_norm, b.ffn_out, b.ffn_norm]
    outs.append(stack.final_layernorm)
    if isinstance(model, (SequenceClassifier, MaskedLM)) and model.pooler is not None:
        both.append(model.pooler.dense)
        outs.append(model.pooler.norm)
    if isinstance(model, (SequenceClassifier, TokenClassifier)):
        ins.append(model.classifier)
    if isinstance(model, Embedder):
        ins.append(model.projection)  # None until `keep_vector_width`: the vectors are the hidden units themselves
    if isinstance(model, MaskedLM):
        (ins if factorized else both).append(model.transform)
        if not factorized:
            outs.append(model.LayerNorm)
        if model.nsp is not None:
            ins.append(model.nsp)
    parts: dict[int, tuple[nn.Module, tuple[int, ...]]] = {}
    for modules, dims in ((ins, (1,)), (outs, (0,)), (both, (0, 1))):
        for m in modules:
            if m is not None:
                parts.setdefault(id(m), (m, dims))
    return list(parts.values())
