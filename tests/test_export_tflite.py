"""TFLite export: one file, a signature per sequence bucket, same logits as unpadded PyTorch."""

import numpy as np
import pytest
import torch

from edgebert.device_tests import HarnessError
from edgebert.device_tests.backends import pick_signature
from edgebert.errors import EdgebertError
from edgebert.model import EncoderConfig, HeadConfig, build
from edgebert.export import Artifact, TFLiteExportConfig, export, formats
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
    return export(model, TFLiteExportConfig(seq_lens=SEQ), out=out)


def one(ids):
    """One example as the eval-set arrays Artifact.run takes."""
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
            "lengths": np.array([ids.shape[1]])}


def test_signatures_and_names(exported):
    m = formats.get("tflite").open(exported.path)
    assert sorted(m.interpreter.get_signature_list()) == ["seq_16", "seq_8"]
    for t in SEQ:
        runner = m.signatures[t].runner
        assert sorted(runner.get_input_details()) == ["attention_mask", "input_ids", "token_type_ids"]
        assert all(d["dtype"] == np.int32 and list(d["shape"]) == [1, t] for d in runner.get_input_details().values())
        assert list(runner.get_output_details()) == ["logits"]
    assert exported.meta["signatures"] == {"seq_8": 8, "seq_16": 16}


@pytest.mark.parametrize("length", [1, 5, 8, 9, 16])
def test_bucketed_logits_match_unpadded_pytorch(model, exported, length):
    rng = np.random.default_rng(length)
    ids = rng.integers(1, 120, (1, length)).astype(np.int32)
    feed = one(ids)
    got = exported.run(feed)
    with torch.no_grad():
        want = model(**{k: torch.from_numpy(feed[k]).long() for k in ("input_ids", "attention_mask",
                                                                        "token_type_ids")}).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_fp16_weights_close(exported, tmp_path):
    path = tmp_path / "h.tflite"
    path.write_bytes(fp16(exported.path.read_bytes()))
    assert path.stat().st_size < exported.path.stat().st_size
    feed = one(np.arange(1, 11, dtype=np.int32)[None])
    np.testing.assert_allclose(Artifact(path).run(feed), exported.run(feed), atol=1e-2)


def test_pick_signature():
    assert pick_signature(1, [16, 32]) == 16 and pick_signature(17, [16, 32]) == 32
    with pytest.raises(HarnessError, match="exceeds the longest signature seq_32"):
        pick_signature(33, [16, 32])


def test_input_longer_than_every_signature_is_one_error(exported):
    with pytest.raises(EdgebertError, match="input of 17 tokens exceeds the longest signature seq_16"):
        exported.run(one(np.ones((1, 17), dtype=np.int32)))


def test_lengths_beyond_positions_fail_before_converting(model, tmp_path):
    with pytest.raises(EdgebertError, match="exceed the model's 32 positions"):
        export(model, TFLiteExportConfig(seq_lens=(16, 64)), out=tmp_path / "m.tflite")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(EdgebertError, match="precision"):
        TFLiteExportConfig(precision="int8")
