"""ModernBERT end to end: its heads and BPE tokenizer load and save with transformers' parity, and every
pass (distill, prune, share, INT8) leaves a model that saves, reloads, exports to ONNX and TFLite and verifies."""

import json
import warnings

import numpy as np
import pytest
import torch
import transformers as T
from builders import subword_tokenizer, tiny_config, tiny_data

from edgebert import EdgebertError, HeadConfig, build, load, save_hf
from edgebert.checkpoint import save
from edgebert.data import TaskData
from edgebert.export import Budget, OnnxExportConfig, TFLiteExportConfig, export
from edgebert.passes import DistillConfig, PruneConfig, ShareConfig, TrainConfig, distill, prune, share
from edgebert.passes.student import init_student

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, pad_token_id=0, local_attention=4, global_attn_every_n_layers=2)
# The same layout as an edgebert config: ModernBERT's seams, over conftest's tiny vocabulary.
MODERN = dict(family="modernbert", type_vocab_size=0, pre_ln=True, position="rotary", attention_window=4,
              global_every=2, gated_ffn=True, bias=False, first_attention_norm=False, layer_norm_eps=1e-5)
HEAD = HeadConfig(pooler="gelu", pooler_norm=True, pooler_bias=False, pooling="mean")
TRAIN = TrainConfig(steps=4, batch_size=16, progress=False, eval_every=4)


def modern(seed=0, **changes):
    torch.manual_seed(seed)
    return build(tiny_config(**{**MODERN, **changes}), HEAD)


def arrays(n=8, t=16, vocab=25):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, t + 1, n).astype(np.int32)
    mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(5, vocab, (n, t)) * mask).astype(np.int32), "attention_mask": mask,
            "lengths": lengths, "labels": rng.integers(0, 2, n)}


def ships(model, tmp_path, name="m"):
    """Save, reload, export to ONNX and TFLite; both files verify against PyTorch."""
    again = load(save(model.eval(), tmp_path / name))
    for config, suffix in ((OnnxExportConfig(), ".onnx"), (TFLiteExportConfig(seq_lens=(16,)), ".tflite")):
        r = export(again, config, out=tmp_path / f"{name}{suffix}", eval_data=arrays(), budget=Budget(max_abs_diff=1e-4))
        assert r.meta["inputs"] == ["input_ids", "attention_mask"] and r.verification["agreement"] == 1.0
    return again


def logits(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask) if isinstance(model, T.PreTrainedModel) else model(ids, mask)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("cls,extra", [(T.ModernBertForSequenceClassification, dict(classifier_pooling="cls", num_labels=3)),
                                       (T.ModernBertForSequenceClassification,
                                        dict(classifier_pooling="mean", classifier_bias=True)),
                                       (T.ModernBertForMaskedLM, {})])
def test_heads_match_transformers_and_save_back(cls, extra, tmp_path):
    torch.manual_seed(0)
    hf = cls(T.ModernBertConfig(**SMALL, **extra)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load(tmp_path / "hf")
    ids = torch.randint(3, 99, (2, 11))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # mean pooling must skip the padding
    reference = logits(hf, ids, mask)
    assert (logits(ours, ids, mask) - reference).abs().max() < 1e-4
    if cls is T.ModernBertForSequenceClassification:
        assert ours.head.pooling == extra["classifier_pooling"] and ours.head.pooler_norm
    save_hf(ours, tmp_path / "back")
    back = cls.from_pretrained(tmp_path / "back").eval()
    assert torch.equal(logits(back, ids, mask), reference)


def test_unmapped_heads_are_refused_in_one_line(tmp_path):
    T.ModernBertForTokenClassification(T.ModernBertConfig(**SMALL)).save_pretrained(tmp_path / "tok")
    with pytest.raises(EdgebertError, match="token classifier .* is not mapped"):
        load(tmp_path / "tok")
    with pytest.raises(EdgebertError, match="dense \\+ norm head"):
        save_hf(build(tiny_config(**MODERN), HeadConfig(pooler=None)), tmp_path / "x")


def test_bpe_tokenizer_loads_as_the_family_expects(tmp_path):
    from edgebert.tokenizer import describe, encode, load_tokenizer

    vocab = subword_tokenizer(tmp_path, ["a good film", "the plot was dull", "great fun"] * 10)
    T.ModernBertConfig(**{**SMALL, "vocab_size": vocab, "pad_token_id": 3}).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tokenizer kind the family does not ship would warn
        tokenizer = load_tokenizer(tmp_path)
    info = describe(tokenizer, 16)
    assert info["type"] == "BPE" and info["single_template"] == "[CLS] A [SEP]" and info["pad_id"] == 3
    ids = encode(tokenizer, ["a good film"], max_length=16).input_ids[0]
    assert ids[0] == 1 and ids[-1] == 2 and tokenizer.decode(ids[1:-1]) == "a good film"


def test_student_from_the_teacher_keeps_the_global_layers(tmp_path):
    teacher = modern()  # layers 0 and 2 global, 1 and 3 sliding-window
    student = init_student(teacher, layers=2)
    kept = [teacher.encoder.encoder.layer[i] for i in (0, 3)]  # the first, then the last local layer
    assert all(torch.equal(s.attention.self.query.weight, t.attention.self.query.weight)
               for s, t in zip(student.encoder.encoder.layer, kept))
    with pytest.raises(EdgebertError, match="global-attention layers"):
        init_student(teacher, keep_layers=[2, 4])
    data = tiny_data(32)
    result = distill(teacher, DistillConfig(layers=2, hidden_weight=1.0, train=TRAIN), TaskData(data, data[:16]),
                     work_dir=tmp_path / "w")
    assert result.record.details["layer_map"] == {1: 1, 2: 4} and result.model.config.num_layers == 2
    ships(result.model, tmp_path)


def test_prune_heads_neuron_pairs_layers_and_width(tmp_path):
    model, data = modern(), tiny_data(32)
    config = PruneConfig(heads=0.5, ffn=0.5, layers=1, width=0.25, sample_batches=2, batch_size=16,
                         recovery=DistillConfig(train=TRAIN))
    pruned = prune(model, config, TaskData(data, data[:16]), work_dir=tmp_path / "w").model
    c = pruned.config
    assert c.num_layers == 3 and c.hidden_size == 24 and c.norm_width == 32 and sum(c.layer_heads) == 8
    layers = pruned.encoder.encoder.layer
    assert layers[0].attention.output.LayerNorm is None  # the first layer stays first: only layer 3 could go
    assert [l.attention.self.window is not None for l in layers] == [False, True, False]
    assert all(l.intermediate.dense.out_features == l.intermediate.gate.out_features == f  # value and gate pairs
               for l, f in zip(layers, c.layer_ffn))
    ships(pruned, tmp_path)


def test_share_ffns_and_factorize_rotary_embeddings(tmp_path):
    model = modern()
    with pytest.raises(EdgebertError, match="differ in attention span .* use parts='ffn'"):
        share(modern(), ShareConfig(parts="all", recovery=None), None)
    record = share(model, ShareConfig(parts="ffn", group_size=2, embedding_size=16, recovery=None), None).record
    layers = model.encoder.encoder.layer
    assert layers[0].intermediate is layers[1].intermediate and model.config.embedding_size == 16
    assert model.encoder.embeddings.position_embeddings is None and record.details["factorization"]["output_error"] < 1
    ships(model, tmp_path)


def test_int8_in_both_formats(tmp_path):
    from edgebert.quantize import DynamicInt8Config, quantize

    model = modern().eval()
    onnx = quantize(model, DynamicInt8Config(), out=tmp_path / "m.int8.onnx", eval_data=arrays())
    tflite = quantize(model, DynamicInt8Config(), out=tmp_path / "m.int8.tflite", eval_data=arrays(),
                      export_as=TFLiteExportConfig(seq_lens=(16,)))
    for artifact in (onnx, tflite):
        assert artifact.verification["agreement"] >= 0.75 and artifact.verification["max_abs_diff"] < 0.5
        assert json.loads(artifact.path.with_name(artifact.path.name + ".meta.json").read_text())


def test_a_width_pruned_model_is_refused_by_save_hf(tmp_path):
    from edgebert.passes.surgery import remove_hidden

    with pytest.raises(EdgebertError, match="width-pruned model .* not expressible"):
        save_hf(remove_hidden(modern(), [0]), tmp_path / "x")
