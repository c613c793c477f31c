"""The architectures edgebert reads and writes: one file per family, registered here.

A Family holds what differs between architectures outside model.py's seams: how a Hugging Face
config.json maps to an EncoderConfig and back, the weight names, the tokenizer kind, the ONNX
inputs and fusion type, and the parity tolerance. `edgebert.checkpoint`, `edgebert.tokenizer` and
the ONNX export ask this registry. Adding an architecture is one new file here plus its tests: every
module of this package is imported on the first lookup, and registers its family.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import EdgebertError
from ..model import EncoderConfig
from ..registry import Registry

# Hugging Face activation names → model.ACTIVATIONS, and back.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_fast": "gelu_tanh", "relu": "relu", "tanh": "tanh"}
TO_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "tanh": "tanh"}


class Slice(NamedTuple):
    """Block `index` of `count` equal row blocks of one Hugging Face tensor: our query, key and value
    from ModernBERT's fused Wqkv, say."""

    name: str
    index: int
    count: int


@dataclass(frozen=True, kw_only=True)
class Family:
    """One architecture. Weight names are Hugging Face's; `weights` maps our Encoder's names to them."""

    name: str  # EncoderConfig.family
    model_types: tuple[str, ...]  # config.json model_type values read as this family; the first is written
    stem: str  # transformers' class prefix: "Bert" → BertModel, BertForSequenceClassification
    prefix: str  # the base model's weight prefix inside a task model ("bert.")
    from_hf: Callable[[dict], EncoderConfig]  # config.json → EncoderConfig
    to_hf: Callable[[EncoderConfig], dict]  # and back; EdgebertError when transformers cannot express it
    weights: Callable[[EncoderConfig], dict[str, str | Slice]]  # Encoder tensor name → base-model tensor
    classifier: str | None = "classifier"  # sequence classifier; None: task heads are not mapped
    pooler: str | None = None  # the [CLS] dense before it (HeadConfig.pooler), if the family has one
    pooler_activation: str = "tanh"
    pooler_norm: str | None = None  # the LayerNorm after the pooler's activation (HeadConfig.pooler_norm)
    head_from_hf: Callable[[dict, str], dict] | None = None  # config.json, head kind → HeadConfig fields
    head_to_hf: Callable[[object, EncoderConfig], dict] | None = None  # HeadConfig, encoder → config.json keys
    mlm: tuple[str, str, str] | None = None  # masked-LM head (transform, its norm, decoder bias); None: unmapped
    nsp: tuple[str, str] | None = None  # (pooler, seq_relationship) of the ...ForPreTraining head
    tokenizers: tuple[str, ...] = ("WordPiece",)  # the `tokenizers` models its checkpoints ship
    inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")  # what its models take
    fusion: str = "bert"  # onnxruntime.transformers optimizer model_type for the exported graph
    tolerance: float = 1e-6  # parity: max |ours − transformers'| on hidden states of a random tiny model


def _import_families() -> None:
    """Every module of this package registers its family: they are found, not listed."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")


FAMILIES: Registry[Family] = Registry("model family", load=_import_families)
get = FAMILIES.get  # the family an EncoderConfig names
names = FAMILIES.names


def register(family: Family) -> Family:
    """Add a family; a model_type another family already reads is refused too."""
    clash = sorted({t for f in FAMILIES.values() for t in f.model_types} & set(family.model_types))
    if clash:
        raise EdgebertError(f"family {family.name!r} clashes with a registered one (model_type {clash}): "
                            "pick new names")
    return FAMILIES.register(family.name, family)


def lookup(model_type: str) -> Family | None:
    """The family that reads config.json's `model_type`, or None."""
    return next((f for f in FAMILIES.values() if model_type in f.model_types), None)


def for_hf(config: dict, where: str = "config.json") -> Family:
    """The family of a Hugging Face config, or one line naming the supported model types."""
    model_type = config.get("model_type", "")
    family = lookup(model_type)
    if family is None:
        supported = ", ".join(t for f in FAMILIES.values() for t in f.model_types)
        raise EdgebertError(f"{where}: unsupported architecture {model_type!r}; edgebert loads {supported} "
                            "(MiniLM uses the bert layout)")
    return family


def activation(config: dict, key: str = "hidden_act") -> str:
    """config.json's activation as a model.ACTIVATIONS name."""
    act = config.get(key, "gelu")
    if act not in HF_ACTIVATIONS:
        raise EdgebertError(f"unsupported activation {act!r} in config.json: edgebert runs {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[act]


def linear(hf: str, ours: str) -> dict[str, str]:
    """The weight and bias names of one Linear or LayerNorm."""
    return {f"{ours}.weight": f"{hf}.weight", f"{ours}.bias": f"{hf}.bias"}

