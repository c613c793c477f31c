"""TFLite export: one file, a signature per sequence bucket, same logits as unpadded PyTorch."""

import numpy as np
import pytest
import torch

from edgebert.errors import EdgebertError
from edgebert.model import EncoderConfig, HeadConfig, build
from edgebert.export import TFLiteExport, export, pick_signature
from edgebert.export.runtime import TFLiteModel
from edgebert.export.tflite import fp16

SEQ = (8, 16)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build(EncoderConfig(vocab_size=120, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                               max_positions=32), HeadConfig()).eval()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("tflite") / "m.tflite"
    return export(model, TFLiteExport(seq_lens=SEQ), out=out)


def test_signatures_and_names(exported):
    m = TFLiteModel(exported.path)
    assert sorted(m.interpreter.get_signature_list()) == ["seq_16", "seq_8"]
    for t in SEQ:
        runner = m.runners[t]
        assert sorted(runner.get_input_details()) == ["attention_mask", "input_ids", "token_type_ids"]
        assert all(d["dtype"] == np.int32 and list(d["shape"]) == [1, t] for d in runner.get_input_details().values())
        assert list(runner.get_output_details()) == ["logits"]
    assert exported.meta["signatures"] == {"seq_8": 8, "seq_16": 16}


@pytest.mark.parametrize("length", [1, 5, 8, 9, 16])
def test_bucketed_logits_match_unpadded_pytorch(model, exported, length):
    rng = np.random.default_rng(length)
    ids = rng.integers(1, 120, (1, length)).astype(np.int32)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    got = TFLiteModel(exported.path)(feed, length)
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(v).long() for k, v in feed.items()}).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_fp16_weights_close(exported, tmp_path):
    path = tmp_path / "h.tflite"
    path.write_bytes(fp16(exported.path.read_bytes()))
    assert path.stat().st_size < exported.path.stat().st_size
    ids = np.arange(1, 11, dtype=np.int32)[None]
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    np.testing.assert_allclose(TFLiteModel(path)(feed, 10), TFLiteModel(exported.path)(feed, 10), atol=1e-2)


def test_pick_signature():
    assert pick_signature(1, [16, 32]) == 16 and pick_signature(17, [16, 32]) == 32
    with pytest.raises(EdgebertError, match="exceeds the longest signature seq_32"):
        pick_signature(33, [16, 32])


def test_lengths_beyond_positions_fail_before_converting(model, tmp_path):
    with pytest.raises(EdgebertError, match="exceed the model's 32 positions"):
        export(model, TFLiteExport(seq_lens=(16, 64)), out=tmp_path / "m.tflite")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(EdgebertError, match="precision"):
        TFLiteExport(precision="int8")
