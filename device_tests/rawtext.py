"""A raw-text model (`model.text.onnx`): strings in, the id model's outputs out, its WordPiece tokenizer inside the
graph as onnxruntime-extensions' custom ops (export/onnx_text.py builds it).

The harness scores a model on eval.npz, which holds token ids, so this class reads each row back into its text
(and pair) with the vocabulary the file carries in its metadata, untimed in `prepare`; the timed call is the whole
graph, tokenization included. `run` then checks the ids the graph read are the row's own, so a score is never
one of other tokens: a text whose ids the graph does not reproduce is an error naming it.
"""

from __future__ import annotations

import json

import numpy as np

from . import HarnessError, runtimes
from .backends import Model, onnx_session
from .evalset import INPUTS

META = "edgebert.text"  # the metadata key holding the file's vocabulary and contract (export/onnx_text.py writes it)


class RawText(Model):
    """ONNX Runtime with onnxruntime-extensions' custom ops registered, fed strings."""

    def __init__(self, path: str, threads: int, provider: str | None = None, *, runtime: runtimes.Runtime,
                 profile: str | None = None):
        extensions = runtime.import_module()
        ort = runtimes.get("onnxruntime").import_module()
        self.name, self.version = runtime.name, f"{extensions.__version__} (onnxruntime {ort.__version__})"
        self.warnings = [runtime.warning] if runtime.warning else []
        self.session, self.accelerator = onnx_session(ort, path, threads, provider, library=extensions.get_library_path(),
                                                      profile=profile)
        found = self.session.get_modelmeta().custom_metadata_map.get(META)
        if found is None:
            raise HarnessError(f"{path} has no {META} metadata: it is not a raw-text model written by edgebert")
        meta = json.loads(found)
        self.vocab, self.specials, self.prefix = meta["vocab"], meta["specials"], meta["prefix"]
        self.texts = [i.name for i in self.session.get_inputs()]  # "text", and "pair" for pair tasks
        self.output, self.max_length = meta["output"], meta["max_length"]
        self.names = list(INPUTS)  # the eval columns it reads texts back from

    def decode(self, ids, types) -> list[str]:
        """The text (and pair) of one row's real ids: pieces joined into words, [CLS] and the closing [SEP]s dropped."""
        cls, sep = self.specials["cls"], self.specials["sep"]
        ids, types = list(ids), list(types)
        if ids and ids[0] == cls:
            ids, types = ids[1:], types[1:]
        if len(self.texts) == 1:
            segments = [ids[:-1] if ids and ids[-1] == sep else ids]
        elif any(types):  # the pair's second text is segment 1
            first = types.index(1)
            segments = [ids[:first - 1], ids[first:-1]]
        else:  # a model without segment ids: the first [SEP] ends the first text
            cut = ids.index(sep) if sep in ids else len(ids)
            segments = [ids[:cut], ids[cut + 1:-1]]
        out = []
        for segment in segments:
            words = []
            for i in segment:
                piece = self.vocab[i]
                if piece.startswith(self.prefix) and words:
                    words[-1] += piece[len(self.prefix):]
                else:
                    words.append(piece)
            out.append(" ".join(words))
        return out

    def prepare(self, feeds: dict[str, np.ndarray]):
        rows = [self.decode(ids[mask == 1], types[mask == 1])
                for ids, mask, types in zip(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])]
        return {name: np.array([row[i] for row in rows], dtype=object) for i, name in enumerate(self.texts)}

    def infer(self, prepared) -> np.ndarray:
        return self.session.run([self.output], prepared)[0]

    def read(self, prepared) -> dict[str, np.ndarray]:
        """Every output of the graph on `prepared` texts: the answer, and the ids it read (`input_ids`, ...)."""
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, prepared)))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        prepared = self.prepare(feeds)
        found = self.read(prepared)
        for r, (want, mask) in enumerate(zip(feeds["input_ids"], feeds["attention_mask"])):
            n = int(found["attention_mask"][r].sum())
            got = found["input_ids"][r, :n], found["token_type_ids"][r, :n]
            if n != int(mask.sum()) or (got[0] != want[mask == 1]).any() \
                    or (got[1] != feeds["token_type_ids"][r][mask == 1]).any():
                text = " | ".join(str(prepared[name][r]) for name in self.texts)
                raise HarnessError(f"the raw-text model read other ids than the eval set holds for {text[:120]!r}: "
                                   "its in-graph tokenizer does not reproduce tokenizer.json on this text")
        return found[self.output]
