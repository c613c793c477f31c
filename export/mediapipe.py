"""TFLite Metadata that lets MediaPipe Tasks' TextClassifier and TextEmbedder load an edgebert model as it is.

MediaPipe's text tasks take a file with exactly ONE subgraph whose fixed [1, T] int32 inputs the
metadata names "ids", "mask" and "segment_ids", a BertTokenizer process unit naming vocab.txt, and
(for TextClassifier) a label file on the output; the files ride in a zip appended to the flatbuffer.
So `add_metadata` (classifier) and `add_embedder_metadata` (sentence embedder: one [1, D] vector
output, no labels) keep one signature (the longest by default) of a multi-signature file, still
named `seq_<T>`, and add that metadata. mediapipe's own writers need a native module its wheel does
not ship, so this builds the same flatbuffers with the generated schema classes: ai-edge-litert's
for the model (the converter's schema, so no field is dropped) and mediapipe's for the metadata.
`for_bundle` picks the file a bundle gets, or says in one line why MediaPipe cannot run the model.
"""

from __future__ import annotations

import importlib
import io
import zipfile
from pathlib import Path

import numpy as np

from edgebert.device_tests.files import atomic_path
from edgebert.errors import EdgebertError

from .tflite import pack, unpack

METADATA_NAME = "TFLITE_METADATA"
# The metadata names MediaPipe's BertPreprocessorCalculator looks the three inputs up by.
BERT_INPUTS = {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "segment_ids"}
_DESCRIPTIONS = {
    "ids": "Token ids of [CLS] text [SEP], zero-padded to the signature length.",
    "mask": "1 for real tokens, 0 for padding.",
    "segment_ids": "0 for the first sequence (MediaPipe passes one sequence).",
}
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so the same inputs give the same bytes


CLASSIFIER, EMBEDDER = "classifier.tflite", "embedder.tflite"  # the bundle's MediaPipe files, by task


def add_metadata(model: str | Path, out: str | Path, *, tokenizer_dir: str | Path, labels: list[str],
                 signature: str | None = None, name: str = "edgebert text classifier") -> dict:
    """Write `out` for MediaPipe's TextClassifier: the `signature` subgraph of `model` (default: the
    longest `seq_<T>`) with MediaPipe metadata, vocab.txt and labels.txt packed in; return what was
    written (for the manifest)."""
    if not labels:
        raise EdgebertError("a MediaPipe TextClassifier needs the class labels: pass labels=[...] in logit order")
    return _write(model, out, tokenizer_dir, signature, name, labels=list(labels))


def add_embedder_metadata(model: str | Path, out: str | Path, *, tokenizer_dir: str | Path,
                          signature: str | None = None, name: str = "edgebert text embedder") -> dict:
    """Write `out` for MediaPipe's TextEmbedder: the `signature` subgraph of a sentence embedder `model`
    (one [1, D] vector output) with MediaPipe metadata and vocab.txt packed in, no label file."""
    return _write(model, out, tokenizer_dir, signature, name, labels=None)


def _write(model, out, tokenizer_dir, signature: str | None, name: str, *, labels: list[str] | None) -> dict:
    from ai_edge_litert import schema_py_generated as fb

    _schema()  # fail before any work when mediapipe is missing
    model, out, tokenizer_dir = Path(model), Path(out), Path(tokenizer_dir)
    what = "classifier" if labels is not None else "embedder"
    if not model.is_file():
        raise EdgebertError(f"{model} does not exist: pass the .tflite {what} to add metadata to")
    raw = model.read_bytes()
    if raw[4:8] != b"TFL3":
        raise EdgebertError(f"{model} is not a TFLite flatbuffer: pass a .tflite file")
    _check_tokenizer_kind(tokenizer_dir)
    tree = unpack(raw)
    key = _keep_signature(tree, signature, model)
    length, width = _check_io(tree, labels, model)
    vocab = _check_tokenizer(tokenizer_dir, length)
    files = {"vocab.txt": vocab}
    if labels is not None:
        files["labels.txt"] = "".join(f"{label}\n" for label in labels).encode()
    order = _input_names(tree)
    metadata, version = _metadata_buffer(name, [BERT_INPUTS[n] for n in order], labels, width)
    _set_metadata(tree, metadata, fb)
    data = _with_zip(pack(tree), files)
    with atomic_path(out) as tmp:
        tmp.write_bytes(data)
    written = {"file": out.name, "task": "TextClassifier" if labels is not None else "TextEmbedder",
               "source": model.name, "signature": key, "max_length": length, "inputs": order}
    written.update({"labels": labels} if labels is not None else {"dimensions": width})
    return {**written, "associated_files": sorted(files), "min_parser_version": version}


# Why a bundle gets no MediaPipe file, by what the model does: one line each, with what to do instead.
SKIPPED = {
    "no-tflite": "the bundle has no model.tflite (export formats lack \"tflite\"), which MediaPipe files are cut from",
    "token-classification": "MediaPipe Tasks has no token-classification (NER) task, only whole-text ones: run "
                            "model.tflite with the bundle's tokenizer.json and the first-piece alignment",
    "regression": "MediaPipe's TextClassifier returns named categories and TextEmbedder vectors, not a "
                  "regression score: run model.tflite with the bundle's tokenizer.json",
    "pair-classification": "MediaPipe's TextClassifier takes one text, not a pair (its BERT preprocessor writes "
                           "[CLS] text [SEP] with segment 0 only): run model.tflite with the bundle's tokenizer.json "
                           "for [CLS] A [SEP] B [SEP]",
}


def for_bundle(folder: str | Path, *, labels: list[str], kind: str | None = None, required: bool = False) -> dict:
    """The MediaPipe file for the bundle `folder` (its model.tflite and tokenizer): embedder.tflite for a
    sentence embedder, classifier.tflite for a text classifier; else {"skipped": one-line reason}.
    `kind` is the task kind where known (a pair task looks like a classifier in the file). `required`:
    raise instead of skipping."""
    folder = Path(folder)
    source = folder / "model.tflite"
    reason = None
    if not source.is_file():
        reason = SKIPPED["no-tflite"]
    elif kind in SKIPPED:
        reason = SKIPPED[kind]
    else:
        output, shape = _output_of(source)
        if len(shape) == 3:
            reason = SKIPPED["token-classification"]
        elif output == "embeddings":
            return _attempt(lambda: add_embedder_metadata(source, folder / EMBEDDER, tokenizer_dir=folder), required)
        elif shape[-1:] == [1]:
            reason = SKIPPED["regression"]
        else:
            return _attempt(lambda: add_metadata(source, folder / CLASSIFIER, tokenizer_dir=folder, labels=labels),
                            required)
    if required:
        raise EdgebertError(f"no MediaPipe file: {reason}")
    return {"skipped": reason}


def _attempt(write, required: bool) -> dict:
    try:
        return write()
    except EdgebertError as e:
        if required:
            raise
        return {"skipped": str(e)}


def _output_of(path: Path) -> tuple[str, list[int]]:
    """(name, shape) of the first signature's one output tensor in a .tflite file."""
    from ai_edge_litert import schema_py_generated as fb

    model = fb.Model.GetRootAs(path.read_bytes(), 0)
    sig = model.SignatureDefs(0) if model.SignatureDefsLength() else None
    if sig is None or sig.OutputsLength() != 1:
        raise EdgebertError(f"{path} needs one signature with one output for MediaPipe: export it with "
                            "export.TFLiteExportConfig")
    graph = model.Subgraphs(sig.SubgraphIndex())
    return sig.Outputs(0).Name().decode(), graph.Tensors(sig.Outputs(0).TensorIndex()).ShapeAsNumpy().tolist()


def _keep_signature(tree, key: str | None, path: Path) -> str:
    """Drop every subgraph but the chosen signature's, and the buffers only they used."""
    sigs = {s.signatureKey.decode(): s for s in tree.signatureDefs or []}
    lengths = {int(k[4:]): k for k in sigs if k.startswith("seq_") and k[4:].isdigit()}
    if key is None:
        if not lengths:
            raise EdgebertError(f"{path} has signatures {sorted(sigs)}, none named seq_<T>: "
                                "export it with export.TFLiteExportConfig or name the signature to keep")
        key = lengths[max(lengths)]
    if key not in sigs:
        raise EdgebertError(f"{path} has no signature {key!r} (it has {sorted(sigs)}): pick one of those")
    if len(tree.subgraphs) != len(sigs):
        raise EdgebertError(f"{path} has {len(tree.subgraphs)} subgraphs for {len(sigs)} signatures (control flow?): "
                            "MediaPipe needs a single-subgraph model; export one without control-flow ops")
    sig = sigs[key]
    graph = tree.subgraphs[sig.subgraphIndex]
    sig.subgraphIndex = 0
    tree.subgraphs, tree.signatureDefs = [graph], [sig]
    used = {0} | {t.buffer for t in graph.tensors} | {m.buffer for m in tree.metadata or []} \
        | set(tree.metadataBuffer or [])
    remap = {old: new for new, old in enumerate(sorted(used))}
    tree.buffers = [tree.buffers[i] for i in sorted(used)]
    for t in graph.tensors:
        t.buffer = remap[t.buffer]
    for m in tree.metadata or []:
        m.buffer = remap[m.buffer]
    if tree.metadataBuffer is not None:
        tree.metadataBuffer = [remap[i] for i in tree.metadataBuffer]
    return key


def _input_names(tree) -> list[str]:
    """The signature's input names in subgraph input order (the metadata must follow that order)."""
    graph, sig = tree.subgraphs[0], tree.signatureDefs[0]
    by_tensor = {m.tensorIndex: m.name.decode() for m in sig.inputs}
    return [by_tensor[i] for i in graph.inputs]


def _check_io(tree, labels: list[str] | None, path: Path) -> tuple[int, int]:
    """(sequence length T, output width); refuse what MediaPipe's BERT classifier (`labels`) or
    embedder (None) cannot run."""
    from ai_edge_litert.schema_py_generated import TensorType

    graph = tree.subgraphs[0]
    names = _input_names(tree)
    if sorted(names) != sorted(BERT_INPUTS):
        raise EdgebertError(f"{path} takes {names}; MediaPipe's BERT models need exactly {list(BERT_INPUTS)}: "
                            "export the model with all three inputs (InputSpec default)")
    shapes = {tuple(graph.tensors[i].shape) for i in graph.inputs}
    types = {graph.tensors[i].type for i in graph.inputs}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != 1 or types != {TensorType.INT32}:
        raise EdgebertError(f"{path} inputs must all be int32 [1, T] for MediaPipe, got shapes {sorted(shapes)}: "
                            "export with TFLiteExportConfig(batch_size=1)")
    what = "logits" if labels is not None else "embeddings"
    if len(graph.outputs) != 1:
        raise EdgebertError(f"{path} has {len(graph.outputs)} outputs; MediaPipe needs one {what} output")
    output = graph.tensors[graph.outputs[0]]
    shape = list(output.shape)
    if output.type not in (TensorType.FLOAT32, TensorType.UINT8) or len(shape) != 2 or shape[0] != 1:
        raise EdgebertError(f"{path} output is {shape}, expected float32 or uint8 [1, D] {what}: export a "
                            f"{'sequence classifier' if labels is not None else 'sentence embedder'} at batch 1")
    if labels is not None and shape[1] != len(labels):
        raise EdgebertError(f"{path} output has shape {shape}, expected [1, {len(labels)}] for {len(labels)} "
                            "labels: pass the labels of this sequence classifier")
    return int(next(iter(shapes))[1]), int(shape[1])


# What MediaPipe Tasks' text tasks tokenize with, by `tokenizers` model name, when edgebert cannot
# write it: BPE they have no tokenizer for; SentencePiece (Unigram) they have, but edgebert writes WordPiece only.
_UNSUPPORTED = {"BPE": "MediaPipe's text tasks have no BPE tokenizer (they run WordPiece and SentencePiece)",
                "Unigram": "edgebert writes MediaPipe's WordPiece tokenizer metadata only, not SentencePiece yet"}


def _check_tokenizer_kind(folder: Path) -> None:
    """Refuse, first and in one line, a tokenizer MediaPipe's text tasks would not reproduce."""
    from edgebert.tokenizer import load_tokenizer

    kind = type(load_tokenizer(folder).backend_tokenizer.model).__name__
    if kind != "WordPiece":
        reason = _UNSUPPORTED.get(kind, f"MediaPipe's text tasks have no {kind} tokenizer")
        raise EdgebertError(f"{reason}, and this model's tokenizer is {kind}: ship model.tflite with the bundle's "
                            "tokenizer.json instead")


def _check_tokenizer(folder: Path, length: int) -> bytes:
    """vocab.txt, if MediaPipe's tokenizer would reproduce the checkpoint's ids: uncased WordPiece
    with [CLS]/[SEP]/[UNK] (MediaPipe lower-cases every input and hard-codes those tokens)."""
    from edgebert.tokenizer import describe, load_tokenizer

    if not (folder / "vocab.txt").is_file():
        raise EdgebertError(f"{folder} has no vocab.txt: save the tokenizer with edgebert.tokenizer.save")
    info = describe(load_tokenizer(folder), length)
    tokens = {k: v["token"] for k, v in info["special_tokens"].items()}
    wanted = {"cls": "[CLS]", "sep": "[SEP]", "unk": "[UNK]"}
    if not info["lowercase"] or any(tokens.get(k) != v for k, v in wanted.items()):
        raise EdgebertError(f"MediaPipe's BERT tokenizer is uncased WordPiece with [CLS]/[SEP]/[UNK], but "
                            f"{folder} is {'' if info['lowercase'] else 'cased '}{info['type']} with {tokens}: "
                            "ship model.tflite with your own tokenizer instead")
    return (folder / "vocab.txt").read_bytes()


def _schema():
    """mediapipe's generated metadata classes: pure Python, unlike its writers' native helpers."""
    try:
        return importlib.import_module("mediapipe.tasks.metadata.metadata_schema_py_generated")
    except ImportError as e:
        raise EdgebertError(f"MediaPipe metadata needs the mediapipe package ({e}): "
                            "pip install 'edgebert[mediapipe]'") from None


def _metadata_buffer(name: str, inputs: list[str], labels: list[str] | None, width: int) -> tuple[bytes, str]:
    """The ModelMetadata flatbuffer (a classifier's with `labels`, else an embedder's) and its minimum
    parser version."""
    import flatbuffers

    md = _schema()

    def tensor(tensor_name: str, description: str, files=None):
        content = md.ContentT()
        content.contentPropertiesType = md.ContentProperties.FeatureProperties
        content.contentProperties = md.FeaturePropertiesT()
        return md.TensorMetadataT(name=tensor_name, description=description, content=content, associatedFiles=files)

    def file(file_name: str, description: str, kind: int):
        return md.AssociatedFileT(name=file_name, description=description, type=kind)

    tokenizer = md.ProcessUnitT(optionsType=md.ProcessUnitOptions.BertTokenizerOptions,
                                options=md.BertTokenizerOptionsT(vocabFile=[
                                    file("vocab.txt", "WordPiece vocabulary, one token per id.",
                                         md.AssociatedFileType.VOCABULARY)]))
    if labels is not None:
        label_file = file("labels.txt", f"{len(labels)} class names, one per line in logit order.",
                          md.AssociatedFileType.TENSOR_AXIS_LABELS)
        graph_name, output = "classifier", tensor("logits", "Unnormalized class scores (argmax = label).", [label_file])
        description = "BERT-family text classifier compiled by edgebert."
    else:
        graph_name = "embedder"
        output = tensor("embeddings", f"Sentence embedding, {width} floats; compare two by cosine similarity.")
        description = "BERT-family sentence embedder compiled by edgebert."
    graph = md.SubGraphMetadataT(
        name=graph_name,
        inputTensorMetadata=[tensor(n, _DESCRIPTIONS[n]) for n in inputs],
        outputTensorMetadata=[output],
        inputProcessUnits=[tokenizer])
    meta = md.ModelMetadataT(name=name, description=description, subgraphMetadata=[graph])
    meta.minParserVersion = min_parser_version(meta)
    builder = flatbuffers.Builder(0)
    builder.Finish(meta.Pack(builder), b"M001")
    return bytes(builder.Output()), meta.minParserVersion


def min_parser_version(meta) -> str:
    """The oldest metadata parser that reads `meta` (a ModelMetadataT): the rules of mediapipe's
    metadata_version.cc, which its Python writers reach only through the native module it lacks."""
    md = _schema()

    unit_versions = {md.ProcessUnitOptions.BertTokenizerOptions: (1, 1, 0),
                     md.ProcessUnitOptions.SentencePieceTokenizerOptions: (1, 1, 0),
                     md.ProcessUnitOptions.RegexTokenizerOptions: (1, 2, 1)}
    found = [(1, 0, 0)]

    def files(items):
        for f in items or []:
            found.extend([(1, 0, 1)] if f.type == md.AssociatedFileType.VOCABULARY else [])
            found.extend([(1, 4, 0)] if f.type == md.AssociatedFileType.SCANN_INDEX_FILE else [])
            found.extend([(1, 4, 1)] if f.version is not None else [])

    def units(items):
        found.extend(unit_versions.get(u.optionsType, (1, 0, 0)) for u in items or [])
        for u in items or []:
            files(getattr(u.options, "vocabFile", None))

    def tensors(items):
        for t in items or []:
            files(t.associatedFiles)
            units(t.processUnits)
            if t.content is not None and t.content.contentPropertiesType == md.ContentProperties.AudioProperties:
                found.append((1, 3, 0))

    for graph in meta.subgraphMetadata or []:
        tensors(graph.inputTensorMetadata)
        tensors(graph.outputTensorMetadata)
        files(graph.associatedFiles)
        for field, version in (("inputProcessUnits", (1, 1, 0)), ("outputProcessUnits", (1, 1, 0)),
                               ("inputTensorGroups", (1, 2, 0)), ("outputTensorGroups", (1, 2, 0)),
                               ("customMetadata", (1, 5, 0))):
            if getattr(graph, field) is not None:
                found.append(version)
        units(graph.inputProcessUnits)
        units(graph.outputProcessUnits)
    files(meta.associatedFiles)
    return ".".join(map(str, max(found)))


def _set_metadata(tree, metadata: bytes, fb) -> None:
    """Put `metadata` in the model's TFLITE_METADATA buffer, replacing any earlier one."""
    buffer = type(tree.buffers[0])(data=np.frombuffer(metadata, dtype=np.uint8))
    tree.metadata = [m for m in tree.metadata or [] if m.name.decode() != METADATA_NAME]
    tree.buffers.append(buffer)
    entry = fb.MetadataT()
    entry.name, entry.buffer = METADATA_NAME, len(tree.buffers) - 1
    tree.metadata.append(entry)


def _with_zip(model: bytes, files: dict[str, bytes]) -> bytes:
    """`model` followed by the associated files as the stored zip MediaPipe reads off its end.

    Appending through zipfile's "a" mode records offsets from the file start, as MetadataPopulator
    does; fixed dates keep the bytes identical for identical inputs."""
    sink = io.BytesIO(model)
    sink.seek(0, 2)
    with zipfile.ZipFile(sink, "a", compression=zipfile.ZIP_STORED) as zf:
        for file_name, data in sorted(files.items()):
            info = zipfile.ZipInfo(file_name, date_time=_ZIP_DATE)
            info.create_system = 3
            zf.writestr(info, data)
    return sink.getvalue()
