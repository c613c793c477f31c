"""The quick default's packaged SST-2 sample (edgebert/data/embedded): it is the rows the quick recipe picks
from the full file, a quick compile reads the same examples from it as from a data folder, and the recipes
that need more than it holds say in one line, before any work, what to pass."""

import pytest

from edgebert import data
from edgebert.errors import EdgebertError
from edgebert.pipeline import recipe as recipes
from edgebert.pipeline.context import _limited, context


@pytest.fixture
def no_data_folder(tmp_path, monkeypatch):
    """A machine with only the repository: no --data, no EDGEBERT_DATA, nothing beside the repository."""
    monkeypatch.delenv("EDGEBERT_DATA", raising=False)
    monkeypatch.setattr(data.tasks, "DEFAULT_DATA", tmp_path / "shared" / "data")


def test_the_sample_is_the_quick_recipes_rows_of_the_full_file(data_dir):
    quick = recipes.load(recipes.RECIPES / "sst2-minilm-quick.toml")
    full = data.load_task("sst2", "train", data_dir=data_dir)
    packaged = data.load_task("sst2", "train", data_dir=data.EMBEDDED_DATA)
    assert len(packaged) == quick.train_limit == data.tasks.EMBEDDED_ROWS["sst2"]
    assert packaged.examples == _limited(full, quick.train_limit, quick.seed).examples
    assert (data.EMBEDDED_DATA / "sst2/dev.tsv").read_bytes() == (data_dir / "sst2/dev.tsv").read_bytes()


def test_data_root_falls_back_to_the_sample_only_for_what_it_holds(no_data_folder, tmp_path, monkeypatch):
    assert data.data_root(task="sst2", rows=3000) == data.data_root(task="sst2", rows=10) == data.EMBEDDED_DATA
    for task, rows in (("sst2", 0), ("sst2", 3001), ("mrpc", 100), (None, 3000)):
        with pytest.raises(EdgebertError, match=r"data/? not found; pass --data DIR .*only `edgebert compile --quick`"):
            data.data_root(task=task, rows=rows)
    with pytest.raises(EdgebertError, match="missing not found; pass --data DIR or set EDGEBERT_DATA$"):
        data.data_root(tmp_path / "missing", task="sst2", rows=3000)  # a folder the user named is never replaced
    monkeypatch.setenv("EDGEBERT_DATA", str(tmp_path / "gone"))
    with pytest.raises(EdgebertError, match="gone not found"):
        data.data_root(task="sst2", rows=3000)


def test_a_quick_compile_reads_the_same_examples_with_or_without_a_data_folder(data_dir, tmp_path, monkeypatch):
    quick = recipes.load(recipes.RECIPES / "sst2-minilm-quick.toml")
    beside = context(quick, tmp_path / "a", None)
    monkeypatch.delenv("EDGEBERT_DATA", raising=False)
    monkeypatch.setattr(data.tasks, "DEFAULT_DATA", tmp_path / "shared" / "data")
    alone = context(quick, tmp_path / "b", None)
    assert alone.sources["train"]["file"] == str(data.EMBEDDED_DATA / "sst2/train.tsv")
    for split in ("train", "eval", "validation"):
        assert getattr(alone.data, split).split.examples == getattr(beside.data, split).split.examples
    assert not (tmp_path / "b").exists()


def test_the_full_default_without_data_says_what_to_pass_before_any_work(no_data_folder, tmp_path):
    with pytest.raises(EdgebertError, match="only `edgebert compile --quick` runs: on the SST-2 sample"):
        context(recipes.load(recipes.RECIPES / "sst2-minilm.toml"), tmp_path / "out", None)
    assert not (tmp_path / "out").exists()
