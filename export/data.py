"""What a model takes (`InputSpec`) and the pre-tokenized arrays it is checked and calibrated on.

Eval and calibration sets are dicts of numpy arrays (or an `.npz` holding them): `input_ids`,
`attention_mask`, `token_type_ids` int [N, T] right-padded, `lengths` [N], and `labels` [N]
(or [N, T] for token tasks, -100 = ignore) where a metric is wanted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch
from torch import nn

from edgebert.device_tests.backends import batches, place
from edgebert.errors import EdgebertError
from edgebert import families
from edgebert.model import Embedder, config_of

ALL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUTS = ("logits", "embeddings")  # scores of a classifier or regressor; a sentence embedder's vectors


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """Which of the three BERT inputs the model takes (DistilBERT-style models lack token_type_ids),
    and what its one output is named in the exported file."""

    names: tuple[str, ...] = ALL_INPUTS
    output: str = "logits"

    def __post_init__(self):
        unknown = [n for n in self.names if n not in ALL_INPUTS]
        if unknown or "input_ids" not in self.names:
            raise EdgebertError(f"InputSpec names {self.names} must include input_ids and only use {ALL_INPUTS}")
        if self.output not in OUTPUTS:
            raise EdgebertError(f"InputSpec output {self.output!r}: use one of {OUTPUTS}")

    @classmethod
    def of(cls, model: nn.Module) -> "InputSpec":
        """The inputs of an edgebert model's family (less segment ids when it has no segment table);
        all three for any other module. An Embedder's output is `embeddings`, any other `logits`."""
        config = config_of(model)
        if config is None:
            return cls()
        names = families.get(config.family).inputs
        output = "embeddings" if isinstance(model, Embedder) else "logits"
        return cls(names=tuple(n for n in names if n != "token_type_ids" or config.type_vocab_size), output=output)


def load_arrays(data, *, what: str = "eval set", spec: InputSpec | None = None) -> dict[str, np.ndarray]:
    """Validate a dict of arrays (or an .npz path); raise one line naming what is wrong."""
    if isinstance(data, (str, Path)):
        if not Path(data).is_file():
            raise EdgebertError(f"{what} {data} does not exist: pass an .npz or a dict of arrays")
        with np.load(data) as f:
            data = {k: f[k] for k in f.files}
    if not isinstance(data, dict):
        raise EdgebertError(f"{what} is a {type(data).__name__}: pass a dict of numpy arrays or an .npz path")
    needed = [*(n for n in (spec.names if spec else ALL_INPUTS) if n != "token_type_ids"), "lengths"]
    missing = [k for k in needed if k not in data]
    if missing:
        raise EdgebertError(f"{what} lacks columns {missing}: pass tokenized arrays {needed} (+ labels)")
    arrays = {k: np.asarray(v) for k, v in data.items()}
    n, t = arrays["input_ids"].shape if arrays["input_ids"].ndim == 2 else (0, 0)
    if arrays["input_ids"].ndim != 2 or n == 0 or t == 0:
        raise EdgebertError(f"{what} is empty or not [N, T] (input_ids shape {arrays['input_ids'].shape}): "
                            "pass at least one tokenized example")
    for k in ALL_INPUTS:
        if k in arrays and arrays[k].shape != (n, t):
            raise EdgebertError(f"{what} column {k} has shape {arrays[k].shape}, expected {(n, t)}")
    if arrays["lengths"].shape != (n,) or arrays["lengths"].min() < 1 or arrays["lengths"].max() > t:
        raise EdgebertError(f"{what} lengths must be [N] with 1 <= length <= {t}")
    if "token_type_ids" not in arrays:  # single-segment inputs: all zeros
        arrays["token_type_ids"] = np.zeros_like(arrays["input_ids"])
    return arrays


@torch.no_grad()
def torch_logits(model: nn.Module, arrays: dict, spec: InputSpec, batch_size: int = 32) -> np.ndarray:
    """The PyTorch reference: the model in eval mode, each batch cut to its longest example."""
    model.eval()
    outs = []
    for rows, feed in batches(arrays, spec.names, batch_size):
        out = model(**{k: torch.from_numpy(v) for k, v in feed.items()})
        outs.append((rows, out.float().numpy()))
    return place(outs, *arrays["input_ids"].shape)
