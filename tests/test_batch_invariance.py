"""Issue 32's batch check on real data: the shared SST-2 teacher's dynamic INT8, with the head of each task,
answers every dev example the same alone, in batches of 8 and 32, and padded to 128; and Optimum's pipeline gives
the same labels at batch 1 and batch 8. The other tasks' heads are untrained: this is about the graph, not the
score, and a bit-for-bit equality holds or fails whatever the weights."""

import json

import numpy as np
import pytest
import transformers

from edgebert import checkpoint
from edgebert.data import pretokenize_eval
from edgebert.data.tasks import get_task
from edgebert.device_tests import backends
from edgebert.export import OnnxExportConfig, export
from edgebert.model import HeadConfig, with_head
from edgebert.pipeline.bundle import write_bundle
from edgebert.quantize import DynamicInt8Config, quantize
from edgebert.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow
HEADS = {"sst2": None, "mrpc": HeadConfig(num_labels=2), "stsb": HeadConfig(num_labels=1),
         "conll2003": HeadConfig(kind="token-classification", num_labels=9, pooler=None),
         "stsb-embedding": HeadConfig(kind="embedding", pooling="mean", normalize=True)}


@pytest.fixture(scope="module")
def teacher(data_dir):
    folder = data_dir.parent / "models" / "minilm-l6-sst2"
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"the shared SST-2 teacher is not at {folder}")
    return folder


def _int8(model, folder):
    fp32 = export(model.eval(), OnnxExportConfig(), out=folder / "fp32.onnx").path
    return quantize(fp32, DynamicInt8Config(), out=folder / "model.onnx").path


@pytest.mark.parametrize("task", list(HEADS))
def test_every_dev_set_gets_the_same_outputs_in_any_batch(task, teacher, data_dir, tmp_path):
    model = checkpoint.load(teacher)
    model = model if HEADS[task] is None else with_head(model, HEADS[task])
    arrays = pretokenize_eval(task, load_tokenizer(teacher), 128, split="dev", data_dir=data_dir)
    loaded = backends.load(str(_int8(model, tmp_path)), "onnxruntime", 1)
    alone = backends.logits(loaded, arrays, batch_size=1)
    padded = {**arrays, "lengths": np.full_like(arrays["lengths"], 128)}
    real = arrays["attention_mask"].astype(bool) if alone.ndim == 3 else slice(None)
    for size, feed in ((8, arrays), (32, arrays), (32, padded)):
        np.testing.assert_array_equal(backends.logits(loaded, feed, batch_size=size)[real], alone[real],
                                      err_msg=f"{get_task(task).name} dev at batch {size}")


def test_optimum_pipeline_labels_do_not_depend_on_the_batch(teacher, data_dir, tmp_path):
    from optimum.onnxruntime import ORTModelForSequenceClassification

    from edgebert.data import load_task

    id2label = json.loads((teacher / "config.json").read_text())["id2label"]
    labels = [id2label[str(i)] for i in range(len(id2label))]
    arrays = pretokenize_eval("sst2", load_tokenizer(teacher), 128, split="dev", data_dir=data_dir)
    bundle = write_bundle(tmp_path / "bundle", models={"model.onnx": _int8(checkpoint.load(teacher), tmp_path)},
                          tokenizer_dir=teacher, labels=labels, eval_arrays=arrays, manifest={"task": "sst2"},
                          max_length=128, source_model=teacher)
    pipe = transformers.pipeline("text-classification", model=ORTModelForSequenceClassification.from_pretrained(bundle),
                                 tokenizer=str(bundle))
    dev = load_task("sst2", "dev", data_dir=data_dir).examples[:200]
    one, eight = pipe([e.text for e in dev], batch_size=1), pipe([e.text for e in dev], batch_size=8)
    assert [o["label"] for o in one] == [e["label"] for e in eight]
    np.testing.assert_array_equal([o["score"] for o in one], [e["score"] for e in eight])
    assert sum(o["label"] == labels[e.label] for o, e in zip(one, dev)) >= 0.85 * len(dev)  # the teacher's answers
    files = json.loads((bundle / "manifest.json").read_text())["inputs"]["files"]["model.onnx"]
    assert files["padding_invariant"] and files["batch_invariant"] and files["batch_max_abs_diff"] == 0
