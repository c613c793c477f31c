"""The sentence-embedding task: pooling, the STS-B pair layout and its metric, and a tiny compile end to end
(distill → prune → INT8 ONNX and TFLite → bundle) whose embedder.tflite MediaPipe's TextEmbedder runs."""

import json

import numpy as np
import pytest
import torch

from builders import tiny_config
from edgebert import EdgebertError, EncoderConfig, HeadConfig, build, save
from edgebert.checkpoint import default_checkpoint
from edgebert.data import Example, Split, compute_metrics, encode_split, get_task, pretokenize_eval
from edgebert.device_tests.metrics import cosine_pairs
from edgebert.model import encoder_of
from edgebert.passes import DistillConfig, PruneConfig, TrainConfig, distill, prune
from edgebert.passes.train import evaluate
from edgebert.pipeline import compile as compiler
from edgebert.pipeline import recipe as recipes

WORDS = ["good", "great", "fun", "bad", "awful", "dull", "film", "plot", "cat", "dog", "man", "woman", "car", "tree"]
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def embedder(seed=0, **changes):
    torch.manual_seed(seed)
    return build(tiny_config(**changes), HeadConfig(kind="embedding", pooling="mean", normalize=True))


def test_pooled_vector_is_the_masked_mean_and_a_sentence_is_its_own_nearest():
    model = embedder().eval()
    ids = torch.tensor([[2, 7, 9, 11, 3, 0, 0], [2, 7, 9, 11, 3, 0, 0], [2, 12, 13, 3, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        vectors = model(ids, mask)
        hidden = encoder_of(model)(ids, mask)
        short = model(ids[:1, :5], mask[:1, :5])  # the same sentence without padding
    by_hand = torch.stack([hidden[i, : int(mask[i].sum())].mean(0) for i in range(3)])
    torch.testing.assert_close(vectors, torch.nn.functional.normalize(by_hand, dim=-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(short, vectors[:1], rtol=1e-5, atol=1e-6)  # padding does not move the vector
    cosines = cosine_pairs(vectors[[0, 1, 0, 2]].numpy())
    assert cosines[0] == pytest.approx(1.0, abs=1e-6) and cosines[1] < cosines[0]


def test_pairs_become_consecutive_rows_scored_by_cosine_spearman(tiny_tokenizer):
    task = get_task("stsb-embedding")
    split = Split(task, "dev", [Example("the cat sat", "the cat sat on the mat", 4.5),
                                Example("the mat", "playing", 0.5), Example("cat", "the cat", 3.0)])
    ids, _, labels, _ = encode_split(split, tiny_tokenizer, 16)
    assert len(ids) == 6 and labels == [4.5, 4.5, 0.5, 0.5, 3.0, 3.0]
    assert ids[0] == tiny_tokenizer("the cat sat")["input_ids"]  # each sentence alone: [CLS] A [SEP]
    arrays = pretokenize_eval(split, tiny_tokenizer, 16)
    assert arrays["labels"].dtype == np.float32 and arrays["input_ids"].shape == (6, 16)
    # vectors whose pair cosines rank as the scores do: Spearman 1, whatever the rotation; negated: -1
    angles = np.array([0.2, 1.5, 0.8])
    vectors = np.stack([v for a in angles for v in ([1.0, 0.0], [np.cos(a), np.sin(a)])])
    assert compute_metrics(task, vectors, arrays["labels"])["cosine_spearman"] == pytest.approx(1.0)
    assert compute_metrics(task, vectors[:, ::-1] * [1, -1], arrays["labels"])["cosine_spearman"] == pytest.approx(1.0)
    opposite = vectors.copy()
    opposite[1::2, 0] *= -1  # each pair's cosine negated
    assert compute_metrics(task, opposite, arrays["labels"])["cosine_spearman"] == pytest.approx(-1.0)


def _items(n, seed=0):
    """Unlabeled sentences of 3..11 random words: what an embedder distils on."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 12, (n,), generator=g).tolist()
    ids = [[2, *torch.randint(5, tiny_config().vocab_size, (k,), generator=g).tolist(), 3] for k in lengths]
    return [{"input_ids": i, "token_type_ids": [0] * len(i)} for i in ids]


def test_embedder_distils_and_prunes_without_labels(tmp_path):
    """A 1-layer student learns its teacher's vectors (cosine loss), and pruning scores units without labels."""
    from edgebert.data import TaskData

    items = _items(64)
    teacher = embedder(num_layers=2).eval()
    config = DistillConfig(layers=1, train=TrainConfig(steps=30, batch_size=16, lr=1e-3, progress=False))
    student = distill(teacher, config, TaskData(items), work_dir=tmp_path / "distill").model.eval()
    assert encoder_of(student).config.num_layers == 1 and student.head.pooling == "mean"
    rows = torch.tensor([item["input_ids"] + [0] * (13 - len(item["input_ids"])) for item in items])
    with torch.no_grad():
        before = torch.nn.functional.cosine_similarity(
            embedder(seed=1, num_layers=1)(rows, (rows != 0).long()), teacher(rows, (rows != 0).long()))
        after = torch.nn.functional.cosine_similarity(student(rows, (rows != 0).long()), teacher(rows, (rows != 0).long()))
    assert after.mean() > 0.95 and after.mean() > before.mean()
    pruned = prune(student, PruneConfig(heads=0.5, ffn=0.5, sample_batches=2, batch_size=16,
                                        recovery=DistillConfig(train=TrainConfig(steps=5, batch_size=16, progress=False))),
                   TaskData(items), work_dir=tmp_path / "prune").model
    c = encoder_of(pruned).config
    assert c.heads(0) == 2 and c.ffn(0) == 32
    with pytest.raises(EdgebertError, match="not labels"):
        distill(teacher, DistillConfig(layers=1, label_weight=1.0), TaskData(items))


@pytest.fixture(scope="module")
def sts(tmp_path_factory):
    """An embedding checkpoint over the real MiniLM vocabulary and a tiny stsb/ data folder."""
    root = tmp_path_factory.mktemp("sts")
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                           max_positions=64)
    model = build(config, HeadConfig(kind="embedding", pooling="mean", normalize=True))
    save(model, root / "model", tokenizer_from=default_checkpoint())
    (root / "data" / "stsb").mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    for split, n in (("train", 64), ("dev", 24)):
        rows = [STSB_HEADER]
        for i in range(n):
            a = [WORDS[j] for j in torch.randint(0, len(WORDS), (5,), generator=g).tolist()]
            shared = int(torch.randint(0, 6, (1,), generator=g))
            b = a[:shared] + [WORDS[j] for j in torch.randint(0, len(WORDS), (5 - shared,), generator=g).tolist()]
            rows.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i}\tnone\tnone\t{' '.join(a)}\t{' '.join(b)}\t{shared:.1f}")
        (root / "data" / "stsb" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return root


RECIPE = """
task = "stsb-embedding"
model = "{model}"
max_length = 16
stages = ["distill", "prune", "quantize", "export"]
[distill]
layers = 1
[distill.train]
steps = 8
batch_size = 8
[prune]
heads = 0.5
ffn = 0.5
sample_batches = 2
batch_size = 8
[prune.recovery.train]
steps = 4
batch_size = 8
[quantize]
accuracy_budget = 100.0
calibration_size = 8
[export]
formats = ["onnx", "tflite"]
seq_lens = [16]
bench = false
"""


@pytest.fixture(scope="module")
def bundle(sts, tmp_path_factory):
    return compiler.compile(recipes.parse(RECIPE.format(model=sts / "model")), tmp_path_factory.mktemp("run") / "out",
                            data_dir=str(sts / "data"))


def test_embedding_compile_verifies_by_cosine_and_names_its_output(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["task"]["kind"], manifest["task"]["metric"]) == ("embedding", "cosine_spearman")
    assert [s["name"] for s in manifest["stages"]] == ["distill", "prune"]
    assert all("cosine_spearman" in s["metrics"] for s in manifest["stages"])
    for name in ("model.onnx", "model.tflite"):
        check = manifest["verification"][name]["verify"]  # the INT8 file against PyTorch on 48 dev sentences
        assert check["examples"] == 48 and check["metric"] == "cosine_spearman"
        assert check["agreement"] > 0.98  # mean cosine of the file's vectors with PyTorch's
        assert abs(check["metric_drop"]) < 0.2
    import onnx

    assert [o.name for o in onnx.load(str(bundle / "model.onnx")).graph.output] == ["embeddings"]
    assert manifest["mediapipe"]["file"] == "embedder.tflite" and manifest["mediapipe"]["task"] == "TextEmbedder"
    assert "embedder.tflite" in manifest["files"] and not (bundle / "labels.txt").exists()


def test_mediapipe_text_embedder_runs_the_bundle(bundle, sts):
    """MediaPipe tokenizes and embeds by itself; its vectors match PyTorch's on the final model."""
    pytest.importorskip("mediapipe", reason="mediapipe is not installed (pip install 'edgebert[mediapipe]')")
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from mediapipe.tasks.python.text import text_embedder

    from edgebert import checkpoint
    from edgebert.tokenizer import load_tokenizer

    sentences = ["a good film", "the dog and the man", "awful plot , dull film", "tree"]
    options = text_embedder.TextEmbedderOptions(base_options=BaseOptions(model_asset_path=str(bundle / "embedder.tflite")))
    with text_embedder.TextEmbedder.create_from_options(options) as embedder:
        got = np.array([embedder.embed(s).embeddings[0].embedding for s in sentences])
    (final,) = (bundle.parent / "stages").glob("02-prune-*/model")
    model = checkpoint.load(final).eval()
    enc = load_tokenizer(bundle)(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).numpy()
    cosines = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert got.shape == ref.shape and cosines.min() >= 0.99


def test_export_only_gives_a_plain_encoder_the_embedding_head(sts, tmp_path):
    """stages = ["export"] on a folder with no head (all-MiniLM-L6-v2's own): the untrained model's reference
    figures, its files scored by cosine Spearman and their output named `embeddings`."""
    import onnx

    from edgebert import checkpoint

    plain = tmp_path / "plain"
    save(encoder_of(checkpoint.load(sts / "model")), plain, tokenizer_from=default_checkpoint())
    text = RECIPE.format(model=plain).replace('stages = ["distill", "prune", "quantize", "export"]',
                                              'stages = ["export"]')
    bundle = compiler.compile(recipes.parse(text), tmp_path / "out", data_dir=str(sts / "data"))
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["stages"] == [] and manifest["verification"]["model.onnx"]["verify"]["metric"] == "cosine_spearman"
    assert [o.name for o in onnx.load(str(bundle / "model.onnx")).graph.output] == ["embeddings"]


def test_an_embedding_recipe_with_finetune_is_refused(sts, tmp_path):
    text = RECIPE.format(model=sts / "model").replace('stages = ["distill"', 'stages = ["finetune", "distill"')
    with pytest.raises(EdgebertError, match="no finetune stage"):
        compiler.compile(recipes.parse(text), tmp_path / "out", data_dir=str(sts / "data"))


def test_shipped_recipe_parses_and_starts_from_minilm():
    from importlib.resources import files

    recipe = recipes.load(files("edgebert") / "recipes" / "stsb-minilm-embedding.toml")
    assert recipe.task == "stsb-embedding" and recipe.model == "minilm" and "finetune" not in recipe.stages
    from edgebert.pipeline.context import embedding_head, start_model

    assert embedding_head(start_model(recipe)) == HeadConfig(kind="embedding", pooling="mean", normalize=True)


@pytest.mark.slow
def test_untrained_all_minilm_scores_sts_b(data_dir):
    """The packaged all-MiniLM-L6-v2, as it is, on the STS-B dev pairs: the reference the issue quotes (0.866)."""
    from edgebert import checkpoint
    from edgebert.data import TaskData, EncodedDataset, load_task
    from edgebert.model import with_head
    from edgebert.pipeline.context import embedding_head
    from edgebert.tokenizer import load_tokenizer

    folder = default_checkpoint()
    model = with_head(checkpoint.load(folder), embedding_head(folder))
    dev = EncodedDataset(load_task("stsb-embedding", "dev"), load_tokenizer(folder), 128)
    assert evaluate(model, TaskData(dev).train)["cosine_spearman"] == pytest.approx(0.866, abs=0.005)
