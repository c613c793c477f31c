"""edgebert: compile BERT-family encoders into small, fast, verified models for phones and edge boards.

The names below load on first use, so `import edgebert.device_tests` (numpy plus one runtime, on a
board or phone) and `edgebert --help` never import torch.
"""

from importlib import import_module

from .errors import EdgebertError

__version__ = "0.1.0"

_LAZY = {
    "load": "checkpoint", "save": "checkpoint", "save_hf": "checkpoint",
    "Embedder": "model", "Encoder": "model", "EncoderConfig": "model", "HeadConfig": "model",
    "MaskedLM": "model", "SequenceClassifier": "model", "TokenClassifier": "model", "build": "model",
    "encoder_of": "model",
}
__all__ = ["EdgebertError", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'edgebert' has no attribute {name!r}")
