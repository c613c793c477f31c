"""A user's own data through `edgebert compile`: CSV, TSV and JSONL files with named columns, the `[data]`
table and the CLI flags that map onto it, the inferred labels and kind, the seeded dev carve, and the
data files' hashes in the stage cache key. Compiles run conftest's fault-kit checkpoint for a few steps."""

import json
import random
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from builders import PASS_WORDS
from edgebert.cli import main
from edgebert import data
from edgebert.data import DataConfig, Example, load_data, load_table
from edgebert.errors import EdgebertError
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.context import context, data_fingerprint, sized

FAST = """
max_length = 16
stages = ["finetune", "quantize", "export"]
[finetune.train]
steps = 2
batch_size = 8
[quantize]
accuracy_budget = 100.0
calibration_size = 8
tflite = "none"
[export]
formats = ["onnx"]
seq_lens = [16]
bench = false
"""


def rows(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(sentence, second sentence) pairs in the fault kit's vocabulary."""
    rng = random.Random(seed)
    return [(" ".join(rng.choice(PASS_WORDS) for _ in range(rng.randint(3, 8))),
             " ".join(rng.choice(PASS_WORDS) for _ in range(rng.randint(2, 5)))) for _ in range(n)]


@pytest.fixture()
def files(tmp_path):
    """reviews.csv (string labels), pairs/train.jsonl + dev.jsonl (pair, int labels), scores.tsv (floats)."""
    csv = ["sentence,label"] + [f"{a},{'pos' if 'good' in a else 'neg'}" for a, _ in rows(40)]
    (tmp_path / "reviews.csv").write_text("\n".join(csv) + "\n")
    (tmp_path / "pairs").mkdir()
    for split, seed in (("train", 1), ("dev", 2)):
        lines = [json.dumps({"question": b, "sentence": a, "label": int("fun" in a)}) for a, b in rows(24, seed)]
        (tmp_path / "pairs" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    tsv = ["text\tscore"] + [f"{a}\t{a.count('good') + 0.5:.1f}" for a, _ in rows(30, 3)]
    (tmp_path / "scores.tsv").write_text("\n".join(tsv) + "\n")
    return tmp_path


def compile_cli(capsys, fault_kit, out, recipe_text, *argv):
    recipe = out.parent / f"{out.name}.toml"
    recipe.write_text(f'model = "{fault_kit.ckpt}"\n{recipe_text}')
    code = main(["compile", str(recipe), "--out", str(out), "--no-bench", *map(str, argv)])
    err = capsys.readouterr().err
    assert code == 0, err
    bundle = out / "bundle"
    return bundle, json.loads((bundle / "manifest.json").read_text())


def test_csv_with_string_labels_through_the_cli(files, fault_kit, capsys, monkeypatch):
    monkeypatch.chdir(files)  # relative paths start from the folder compile runs in
    bundle, manifest = compile_cli(capsys, fault_kit, files / "out", FAST, "--task", "reviews.csv",
                                   "--text-column", "sentence")
    assert (bundle / "labels.txt").read_text() == "neg\npos\n"
    assert manifest["task"] == {"name": "reviews", "kind": "classification", "metric": "accuracy"}
    assert manifest["labels"] == ["neg", "pos"]
    assert manifest["data"]["dev"] == {"carved_from": "train", "fraction": 0.1, "seed": 42, "rows": 4}
    assert manifest["data"]["train"]["rows"] == 36 and len(manifest["data"]["train"]["sha256"]) == 64
    assert "accuracy" in manifest["stages"][0]["metrics"]
    assert manifest["verification"]["model.onnx"]["verify"]["metric"] == "accuracy"


def test_jsonl_pair_with_int_labels_and_a_dev_file(files, fault_kit, capsys):
    table = f'[data]\ntrain = "{files}/pairs/train.jsonl"\ndev = "{files}/pairs/dev.jsonl"\n' \
            'text = "sentence"\npair = "question"\n'
    bundle, manifest = compile_cli(capsys, fault_kit, files / "out", FAST + table)
    assert (bundle / "labels.txt").read_text() == "0\n1\n"
    assert manifest["task"] == {"name": "pairs", "kind": "pair-classification", "metric": "f1"}
    assert manifest["data"]["dev"]["rows"] == 24 and manifest["data"]["dev"]["file"].endswith("dev.jsonl")
    assert "f1" in manifest["stages"][0]["metrics"]
    assert manifest["verification"]["model.onnx"]["verify"]["metric"] == "f1"


def test_tsv_with_scores_is_regression(files, fault_kit, capsys):
    table = f'[data]\ntrain = "{files}/scores.tsv"\nlabel = "score"\ndev_fraction = 0.2\n'
    bundle, manifest = compile_cli(capsys, fault_kit, files / "out", FAST + table)
    assert not (bundle / "labels.txt").exists() and manifest["labels"] == []
    assert manifest["task"] == {"name": "scores", "kind": "regression", "metric": "spearman"}
    assert manifest["data"]["dev"]["rows"] == 6
    assert manifest["verification"]["model.onnx"]["verify"]["metric"] == "spearman"


def table(files, **fields) -> str:
    fields = {"train": f"{files}/reviews.csv", "text": "sentence", **fields}
    return "[data]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in fields.items() if v is not None)


@pytest.mark.parametrize("fields, message", [
    (dict(label="lable"), 'data.label: column "lable" not in reviews.csv (columns: sentence, label)'),
    (dict(pair="question"), 'data.pair: column "question" not in reviews.csv'),
    (dict(train="nowhere.csv"), "data.train: nowhere.csv not found (no "),
    (dict(train=None), "data.train: missing; name your training file"),
    (dict(train="notes.txt"), "data.train: notes.txt is not a .csv, .tsv or .jsonl file"),
    (dict(kind="ner"), "data.kind: unknown kind 'ner'; use one of classification, pair-classification, regression"),
    (dict(dev_fraction=1.5), "data.dev_fraction: expected a fraction between 0 and 1, got 1.5"),
    (dict(labels=["a"]), "data.labels: unknown field; data takes dataset, dataset_config, dev"),
    (dict(text=3), 'data.text: expected a string, got 3'),
])
def test_data_table_mistakes_name_the_field(files, fields, message):
    with pytest.raises(EdgebertError) as e:
        load_data(recipes.parse(table(files, **fields)).data, seed=0)
    assert message in str(e.value)


def test_a_recipe_file_reads_its_data_beside_it_wherever_compile_runs(files, tmp_path, monkeypatch):
    (files / "recipe.toml").write_text('[data]\ntrain = "reviews.csv"\ntext = "sentence"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = recipes.load(files / "recipe.toml")
    assert recipe.data.train == str(files / "reviews.csv")
    train, dev, sources = load_data(recipe.data, seed=0)
    assert len(train) + len(dev) == 40


def test_task_and_data_table_together_is_refused(files):
    with pytest.raises(EdgebertError, match=r'task: the recipe names its data twice \(task = "sst2"'):
        recipes.parse('task = "sst2"\n' + table(files))


def test_one_label_value_and_dev_labels_outside_train(files):
    (files / "one.csv").write_text("text,label\ngood,pos\nfun,pos\n")
    with pytest.raises(EdgebertError, match=r"data.label: the training data has 1 label value\(s\) \['pos'\]"):
        load_data(DataConfig(train=str(files / "one.csv")), seed=0)
    (files / "dev.csv").write_text("sentence,label\ngood,pos\nfun,meh\n")
    with pytest.raises(EdgebertError, match=r"dev.csv:3: unknown label 'meh'; expected \['neg', 'pos'\]"):
        load_data(DataConfig(train=str(files / "reviews.csv"), dev=str(files / "dev.csv"), text="sentence"), seed=0)


def test_bad_rows_stop_with_the_line_or_skip(files, fault_kit, capsys):
    (files / "bad.csv").write_text((files / "reviews.csv").read_text() + ",pos\nfun film,\n")
    config = DataConfig(train=str(files / "bad.csv"), text="sentence")
    with pytest.raises(EdgebertError, match=r"bad.csv:42: empty text; fix the row, or skip bad rows"):
        load_data(config, seed=0)
    with pytest.warns(UserWarning, match="skipped 2 bad rows"):
        train, dev, record = load_data(config, seed=0, on_bad_row="skip")
    assert record["train"]["skipped"] == 2 and len(train) + len(dev) == 40
    out = files / "refused"  # through the CLI: refused before the output folder exists
    recipe = files / "r.toml"
    recipe.write_text(f'model = "{fault_kit.ckpt}"\n{FAST}{table(files, train=str(files / "bad.csv"))}')
    assert main(["compile", str(recipe), "--out", str(out), "--no-bench"]) == 2
    assert "bad.csv:42: empty text" in capsys.readouterr().err and not out.exists()


BAD_INPUT = [  # (file, content, what the one line says): the input-semantics classes, through the CLI
    ("dup.csv", "sentence,label,sentence\na,pos,b\n", "dup.csv:1: column 'sentence' appears twice in the header"),
    ("nan.tsv", "sentence\tlabel\na\t1.5\nb\tnan\n", "nan.tsv:3: label 'nan' is not a finite number"),
    ("nested.jsonl", '{"sentence": {"a": 1}, "label": "pos"}\n',
     "nested.jsonl:1: text must be a string, got an object"),
    ("array.jsonl", '{"sentence": "a", "label": "pos"}\n["b", "neg"]\n',
     "array.jsonl:2: the line holds an array, not a JSON object with named fields"),
    ("nul.csv", "sentence,label\na,pos\nb\x00,neg\n", "nul.csv:3: text holds a NUL character at character 2"),
]


@pytest.mark.parametrize("name, content, expect", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_one_line_through_the_cli(files, fault_kit, capsys, name, content, expect):
    (files / name).write_text(content)
    recipe, out = files / "r.toml", files / "refused"
    recipe.write_text(f'model = "{fault_kit.ckpt}"\n{FAST}{table(files, train=str(files / name))}')
    assert main(["compile", str(recipe), "--out", str(out), "--no-bench"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("edgebert: error: ") and expect in err, err
    assert not out.exists()


def test_carved_dev_split_follows_the_seed(files):
    config = DataConfig(train=str(files / "reviews.csv"), text="sentence", dev_fraction=0.25)
    a, b, c = (load_data(config, seed=s)[1].examples for s in (1, 1, 2))
    assert a == b and a != c and len(a) == 10
    train, dev, _ = load_data(config, seed=1)
    every = load_table(files / "reviews.csv", text_column="sentence").examples
    assert sorted(map(repr, train.examples + dev.examples)) == sorted(map(repr, every))
    assert train.task is dev.task and train.task.labels == ("neg", "pos")


def test_editing_the_file_changes_the_stage_key(files, fault_kit):
    recipe = recipes.parse(f'model = "{fault_kit.ckpt}"\n{FAST}{table(files)}')
    before = data_fingerprint(context(recipe, files / "out", None))
    text = (files / "reviews.csv").read_text()
    first = text.splitlines()[1]
    flipped = first.replace(",pos", ",neg") if first.endswith(",pos") else first.replace(",neg", ",pos")
    (files / "reviews.csv").write_text(text.replace(first, flipped, 1))  # one training label, same text
    after = data_fingerprint(context(recipe, files / "out", None))
    assert before != after
    assert data_fingerprint(context(recipe, files / "out", None)) == after


def test_cli_flags_map_onto_the_data_table(files):
    base = recipes.parse(table(files))
    changed = recipes.with_data(base, None, dev=str(files / "dev.csv"), label="label", kind="classification")
    assert changed.data == base.data.replace(dev=str(files / "dev.csv"), kind="classification")
    moved = recipes.with_data(base, "other.tsv")
    assert (moved.data.train, moved.data.text, moved.task) == ("other.tsv", "sentence", None)
    back = recipes.with_data(base, "mrpc")
    assert (back.task, back.data) == ("mrpc", None)
    with pytest.raises(EdgebertError, match="data.text: set for your own files, but the recipe reads the registered "
                                            "task 'sst2'; pass --task FILE.csv"):
        recipes.with_data(recipes.parse(""), None, text="sentence")
    with pytest.raises(EdgebertError, match="data.pair: set for your own files, but the task is 'mrpc'"):
        recipes.with_data(base, "mrpc", pair="q")
    assert recipes.parse('task = "x/train.jsonl"').data == DataConfig(train="x/train.jsonl")


def test_online_dataset_through_the_data_table(monkeypatch):
    """No hub: a fake `datasets` module, as tests/test_data.py does."""

    class Rows(list):
        features = {}  # plain string labels, no ClassLabel

    splits = {"train": Rows({"text": f"good {i}", "label": ["no", "yes"][i % 2]} for i in range(20)),
              "validation": Rows([{"text": "fine", "label": "yes"}, {"text": "meh", "label": "no"}])}
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return splits[split]

    monkeypatch.setitem(sys.modules, "datasets", SimpleNamespace(load_dataset=load_dataset))
    config = recipes.parse('[data]\ndataset = "user/reviews"\ndev = "validation"\n').data
    train, dev, record = load_data(config, seed=0)
    assert calls == [("user/reviews", None, "train"), ("user/reviews", None, "validation")]
    assert train.task.labels == ("no", "yes") and train.task.name == "user/reviews"
    assert dev.examples == [Example("fine", None, 1), Example("meh", None, 0)]
    assert record["dev"] == {"split": "validation", "rows": 2, "skipped": 0}


@pytest.mark.slow
def test_a_user_csv_made_from_sst2(data_dir, tmp_path, capsys):
    """The issue's real check: SST-2's files rewritten as a user's CSV (string labels, other column names),
    compiled from the packaged MiniLM for a few steps; the bundle carries the inferred labels."""
    import csv

    names = {"0": "negative", "1": "positive"}
    for split, limit in (("train", 2000), ("dev", None)):
        lines = (data_dir / "sst2" / f"{split}.tsv").read_text().splitlines()[1:]
        with open(tmp_path / f"{split}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["review", "sentiment"])
            for line in lines[:limit]:
                text, label = line.rsplit("\t", 1)
                writer.writerow([text.strip(), names[label]])
    recipe = tmp_path / "user.toml"
    recipe.write_text(f"""
max_length = 64
eval_limit = 200
stages = ["finetune", "quantize", "export"]
[data]
name = "sst2-csv"
train = "{tmp_path}/train.csv"
dev = "{tmp_path}/dev.csv"
text = "review"
label = "sentiment"
[finetune.train]
steps = 60
batch_size = 16
[quantize]
tflite = "none"
accuracy_budget = 5.0
[export]
formats = ["onnx"]
seq_lens = [64]
bench = false
""")
    out = tmp_path / "out"
    assert main(["compile", str(recipe), "--out", str(out), "--no-bench"]) == 0, capsys.readouterr().err
    manifest = json.loads((out / "bundle" / "manifest.json").read_text())
    assert (out / "bundle" / "labels.txt").read_text() == "negative\npositive\n"
    assert manifest["task"] == {"name": "sst2-csv", "kind": "classification", "metric": "accuracy"}
    assert manifest["data"]["dev"]["rows"] == 872 and manifest["data"]["train"]["rows"] == 2000
    check = manifest["verification"]["model.onnx"]["verify"]  # measured: 0.63 float, 0.625 INT8 (majority 0.52)
    assert check["metric"] == "accuracy" and check["value"] > 0.56 and check["agreement"] > 0.9, check


def test_the_task_kind_picks_the_packaged_recipe(files):
    """`edgebert compile --task X` with no recipe starts from the packaged recipe of X's kind."""
    def picked(task=None, **fields):
        return recipes.for_task(task, **fields).name

    assert picked() == picked("sst2") == picked(str(files / "reviews.csv"), text="sentence") == "sst2-minilm.toml"
    assert picked("mrpc") == picked(str(files / "pairs/train.jsonl"), text="sentence", pair="question") \
        == "mrpc-minilm.toml"
    assert picked("stsb") == picked(str(files / "scores.tsv"), label="score") == "stsb-minilm.toml"
    assert picked(str(files / "reviews.csv"), text="sentence", kind="regression") == "stsb-minilm.toml"
    assert picked("conll2003") == "conll2003-minilm.toml"
    assert picked("stsb-embedding") == "stsb-minilm-embedding.toml"
    for kind, name in recipes.BY_KIND.items():  # each kind's recipe is packaged and reads a task of that kind
        assert data.get_task(recipes.load(recipes.RECIPES / name).task).kind == kind
    (files / "bad.csv").write_text((files / "reviews.csv").read_text() + "fun film,\n")
    with pytest.raises(EdgebertError, match="bad.csv:42: missing label; fix the row, or skip bad rows"):
        picked(str(files / "bad.csv"), text="sentence")
    with pytest.warns(UserWarning, match="skipped 1 bad row"):  # as --on-bad-row skip will compile it
        assert recipes.for_task(str(files / "bad.csv"), on_bad_row="skip", text="sentence").name == "sst2-minilm.toml"
    with pytest.raises(EdgebertError, match='data.text: column "sentence" not in scores.tsv'):
        picked(str(files / "scores.tsv"), text="sentence")  # a wrong column is named before any work


def test_step_counts_follow_the_data_size(files, fault_kit, capsys, monkeypatch):
    """A recipe's `sized_for` scales every training run's steps, eval_every and warmup counts to the data."""
    recipe = recipes.parse(f'model = "{fault_kit.ckpt}"\nsized_for = 360\n' + FAST + """
[prune.recovery.train]
steps = 40
eval_every = 20
warmup = 10
""")
    tenth = sized(recipe, 36)
    unsized = replace(recipe, sized_for=0)
    assert sized(recipe, 360) is recipe and sized(unsized, 36) is unsized
    train = tenth.stage("prune").recovery.train
    assert (train.steps, train.eval_every, train.warmup) == (4, 2, 1)
    finetune = recipe.stage("finetune").train
    assert tenth.stage("finetune").train == finetune.replace(steps=max(1, round(finetune.steps / 10)),
                                                             warmup=finetune.warmup)  # a fraction stays
    monkeypatch.chdir(files)  # reviews.csv: 36 training rows once dev is carved, so twice sized_for = 18
    _, manifest = compile_cli(capsys, fault_kit, files / "out", f"sized_for = 18\n{FAST}", "--task", "reviews.csv",
                              "--text-column", "sentence")
    assert manifest["stages"][0]["steps"] == 2 * finetune.steps


def test_each_packaged_recipe_is_sized_for_its_own_training_split(data_dir):
    """On the data it was written for, a packaged recipe runs its step counts as written."""
    for name in recipes.BY_KIND.values():
        recipe = recipes.load(recipes.RECIPES / name)
        assert recipe.sized_for == len(data.load_task(recipe.task, "train", data_dir=data_dir)), name
