"""edgebert: compile BERT-family encoders into small, fast, verified models for phones and edge boards."""

from .checkpoint import load, save, save_hf
from .errors import EdgebertError
from .model import (Embedder, Encoder, EncoderConfig, HeadConfig, MaskedLM, SequenceClassifier,
                    TokenClassifier, build)

__version__ = "0.1.0"
__all__ = ["Embedder", "EdgebertError", "Encoder", "EncoderConfig", "HeadConfig", "MaskedLM",
           "SequenceClassifier", "TokenClassifier", "build", "load", "save", "save_hf"]
