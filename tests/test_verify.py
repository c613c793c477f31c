"""The first-run check: a bundle carries golden outputs of each of its model files (golden.json), and
`python -m device_tests verify` checks each file's sha256 and, apart from it, its outputs on them, locally and
through `edgebert bench` on a target. A flipped weight byte must fail it, whether or not the manifest was
changed along with the file."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_device_adb import adb  # noqa: F401  the fake phone, for the remote path
from tiny_models import VOCAB, tiny_module

from edgebert.bench import bench, register, table
from edgebert.device_tests import backends, runtimes
from edgebert.device_tests.files import sha256
from edgebert.device_tests.verify import EXAMPLES, RELATIVE, inputs_of
from edgebert.pipeline.bundle import verify_bundle, write_bundle
from edgebert.targets import BenchError

ROOT = Path(__file__).resolve().parent.parent
LABELS = ["negative", "positive"]
# Bytes each file holds that no output depends on: ONNX's producer name, TFLite's model description.
HARMLESS = {"model.onnx": (b"pytorch", b"pytorcH"), "model.tflite": (b"MLIR Converted.", b"MLIR Converted!")}


@pytest.fixture(scope="module")
def bundle(tiny, tmp_path_factory) -> Path:
    """The tiny ONNX and TFLite models (tests/tiny_models.py) written as a bundle, with a 200-token WordPiece
    vocabulary so that the harness takes the eval set's ids; classifier.tflite too where MediaPipe is installed."""
    folder = tmp_path_factory.mktemp("verify")
    tokenizer = folder / "tokenizer"
    tokenizer.mkdir()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tokenizer / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i in range(len(specials), VOCAB)]) + "\n")
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                                 "do_lower_case": True, "model_max_length": 64}))
    return write_bundle(folder / "bundle", models={n: tiny["bundle"] / n for n in HARMLESS}, tokenizer_dir=tokenizer,
                        labels=LABELS, eval_arrays=tiny["bundle"] / "eval.npz", manifest={})


def verify(*args) -> tuple[int, dict[str, str], list[str]]:
    """`python -m device_tests verify ...` in a subprocess, the folder run as its own package, as on a device:
    the exit status, each file's line by file name, and the other lines (runtime logs left out); never a
    traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "device_tests", "verify", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))}
    return proc.returncode, lines, [ln for ln in proc.stdout.splitlines() + proc.stderr.splitlines()
                                    if not ln.startswith(("PASS ", "FAIL ", "INFO:"))]


def _golden(folder: Path) -> dict:
    return json.loads((folder / "golden.json").read_text())


def _copy(bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(bundle, tmp_path / "bundle"))


def _flip_weight(folder: Path, name: str) -> None:
    """Flip one byte of the file's largest weight, the word table (200 x 64 float32, which both formats store as
    it is): the high byte of the first value in the row of the first golden example's first token, so that value
    grows by 2^128. (A byte of the hidden layer's first weight moved the outputs by less than the tolerance: that
    unit's ReLU is closed on every golden example.)"""
    table = tiny_module().state_dict()["emb.weight"].numpy().astype(np.float32)
    token = _golden(folder)["examples"][0]["input_ids"][0]
    data = bytearray((folder / name).read_bytes())
    assert data.count(table.tobytes()) == 1, "the word table is stored once, as it is"
    data[data.find(table.tobytes()) + token * table.strides[0] + 3] ^= 0x40
    (folder / name).write_bytes(bytes(data))


def _list(folder: Path, name: str) -> None:
    """Change the manifest's entry for `name` to the file as it now is: only the outputs can tell."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": sha256(folder / name), "bytes": (folder / name).stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _outputs(path: Path, golden: dict) -> np.ndarray:
    """The file's outputs on the golden examples, in its runtime, one example at a time."""
    model = backends.load(str(path), runtimes.choose(str(path)).name, 1)
    return backends.logits(model, inputs_of(golden), batch_size=1)


def test_golden_outputs_are_each_files_own_listed_in_the_manifest(bundle, tiny):
    manifest = verify_bundle(bundle)  # golden.json's sha256 and bytes are in the manifest like every file's
    golden = _golden(bundle)
    models = {p.name for p in bundle.iterdir() if p.suffix in runtimes.formats().values()}
    assert set(golden["files"]) == set(manifest["golden"]["files"]) == models >= set(HARMLESS)
    rows = [e["row"] for e in golden["examples"]]
    assert manifest["golden"]["examples"] == rows and len(set(rows)) == EXAMPLES
    with np.load(bundle / "eval.npz") as f:
        eval_set = dict(f)
    lengths = [e["length"] for e in golden["examples"]]
    assert lengths == sorted(lengths) and lengths[0] == eval_set["lengths"].min()
    assert lengths[-1] == eval_set["lengths"].max()  # the shortest and the longest: every signature's range
    for e in golden["examples"]:
        for k in ("input_ids", "attention_mask", "token_type_ids"):
            assert e[k] == eval_set[k][e["row"], :e["length"]].tolist()
    for name, entry in golden["files"].items():
        outputs = np.array(entry["outputs"])
        np.testing.assert_allclose(outputs, tiny["reference"][rows], atol=1e-4)  # what the weights compute
        assert entry["tolerance"] == pytest.approx(RELATIVE * np.abs(outputs).max())  # no run-to-run noise here
        assert entry["noise"] == 0 and entry["labels"] and entry["runtime"] == runtimes.choose(name).name
        assert manifest["golden"]["files"][name] == {k: v for k, v in entry.items() if k != "outputs"}


def test_untouched_bundle_passes(bundle, tmp_path):
    code, lines, rest = verify(bundle, "--json", tmp_path / "v.json")
    assert code == 0 and set(lines) == set(_golden(bundle)["files"])
    for line in lines.values():
        assert line.startswith("PASS ")
        assert "sha256 matches the manifest; outputs within tolerance: max |diff| 0 <=" in line
    assert rest == [f"verify: PASS, {len(lines)} checks"]
    result = json.loads((tmp_path / "v.json").read_text())
    assert result["passed"] and all(c["max_abs_diff"] == 0 and c["labels_differ"] == 0 for c in result["checks"])
    code, lines, _ = verify(bundle / "model.tflite")  # one file of the bundle
    assert code == 0 and list(lines) == ["model.tflite"]


@pytest.mark.parametrize("name", list(HARMLESS))
def test_flipped_weight_byte_fails_on_the_hash_and_on_the_outputs(bundle, tmp_path, name):
    folder = _copy(bundle, tmp_path)
    _flip_weight(folder, name)
    golden = _golden(folder)
    entry = golden["files"][name]
    moved = np.abs(_outputs(folder / name, golden) - np.array(entry["outputs"])).max()
    assert moved > 10 * entry["tolerance"], "the flipped byte must really change the outputs"
    code, lines, rest = verify(folder)
    assert code == 1
    assert lines[name].startswith(f"FAIL {name} (")
    assert "sha256 differs from the manifest; outputs OUTSIDE tolerance: max |diff| " in lines[name]
    assert all(line.startswith("PASS ") for n, line in lines.items() if n != name)
    assert rest == [f"verify: FAIL, 1 of {len(lines)} checks failed"]


@pytest.mark.parametrize("name", list(HARMLESS))
def test_changed_file_with_its_manifest_entry_fails_on_the_outputs(bundle, tmp_path, name):
    folder = _copy(bundle, tmp_path)
    _flip_weight(folder, name)
    _list(folder, name)
    code, lines, _ = verify(folder, "--json", tmp_path / "v.json")
    assert code == 1 and lines[name].startswith(f"FAIL {name} (")
    assert "sha256 matches the manifest; outputs OUTSIDE tolerance" in lines[name]
    (check,) = [c for c in json.loads((tmp_path / "v.json").read_text())["checks"] if c["file"] == name]
    assert check["sha256_matches"] and not check["outputs_match"] and check["max_abs_diff"] > check["tolerance"]


@pytest.mark.parametrize("name", list(HARMLESS))
def test_changed_bytes_that_keep_the_outputs_fail_on_the_hash(bundle, tmp_path, name):
    folder = _copy(bundle, tmp_path)
    before, after = HARMLESS[name]
    data = (folder / name).read_bytes()
    assert data.count(before) == 1
    (folder / name).write_bytes(data.replace(before, after))
    code, lines, _ = verify(folder, "--format", runtimes.for_file(name)[0].format)
    assert code == 1 and lines[name].startswith(f"FAIL {name} (")
    assert "sha256 differs from the manifest; outputs within tolerance: max |diff| 0 <=" in lines[name]


def test_a_file_its_runtime_cannot_load_fails_with_the_reason(bundle, tmp_path):
    folder = _copy(bundle, tmp_path)
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data[: len(data) // 2])
    code, lines, _ = verify(folder / "model.onnx")
    assert code == 1
    assert lines["model.onnx"].startswith("FAIL model.onnx (onnxruntime): sha256 differs from the manifest; "
                                          "outputs: onnxruntime cannot load")


def test_bad_input_is_one_line_exit_2(bundle, tiny, tmp_path):
    old = tiny["bundle"]  # its manifest predates golden outputs
    folder = _copy(bundle, tmp_path)
    shutil.copy(folder / "model.onnx", folder / "extra.onnx")
    (tmp_path / "empty").mkdir()
    changed = _copy(bundle, tmp_path / "changed")
    golden = _golden(changed)
    golden["files"]["model.onnx"]["tolerance"] = 1e9
    (changed / "golden.json").write_text(json.dumps(golden))
    cases = [((tmp_path / "nothing",), "does not exist: pass a bundle folder"),
             ((tmp_path / "empty",), "has no manifest.json: pass a bundle folder written by edgebert"),
             ((old,), "was written before bundles held golden outputs .*: compile it again with this edgebert"),
             ((changed,), "golden.json sha256 differs from the manifest: .* copy the bundle again"),
             ((folder / "extra.onnx",), "extra.onnx has no golden outputs in golden.json"),
             ((bundle, "--format", "executorch"), "--format executorch: the bundle has no .pte file"),
             ((bundle, "--backend", "tflite-runtime"), "--backend tflite-runtime is not installed here: pip install")]
    for args, message in cases:
        if "tflite-runtime" in args and runtimes.get("tflite-runtime").installed():
            continue
        code, lines, rest = verify(*args)
        assert code == 2 and not lines and len(rest) == 1, rest
        assert rest[0].startswith("device_tests: error: ") and re.search(message, rest[0]), rest[0]


def _cli(*argv) -> None:
    parser = argparse.ArgumentParser(prog="edgebert")
    register(parser.add_subparsers())
    args = parser.parse_args(["bench", *map(str, argv)])
    args.run(args)


def test_bench_verifies_each_file_first_and_fails_loudly(bundle, tiny, tmp_path, capsys):
    report = bench(bundle, warmup=1, runs=3)
    assert all(r["verify"]["passed"] and r["verify"]["sha256_matches"] for r in report["runs"])
    folder = _copy(bundle, tmp_path)
    _flip_weight(folder, "model.onnx")
    _list(folder, "model.onnx")  # so the harness runs it: only the outputs tell
    out = tmp_path / "results.json"
    with pytest.raises(BenchError, match=r"verify failed for model\.onnx · onnxruntime · local: .* not the bundle's"):
        _cli(folder, "--warmup", 1, "--runs", 3, "--json", out)
    printed = capsys.readouterr()
    row = next(line for line in printed.out.splitlines() if "| model.onnx · onnxruntime · local |" in line)
    assert "| FAIL: outputs " in row
    assert "bench: verify FAILED on local: FAIL model.onnx (onnxruntime " in printed.err
    runs = {r["model"]["file"]: r for r in json.loads(out.read_text())["runs"]}  # the results are still written
    assert runs["model.onnx"]["verify"]["passed"] is False and runs["model.onnx"]["verify"]["sha256_matches"]
    assert runs["model.tflite"]["verify"]["passed"] is True
    (old,) = bench(tiny["bundle"] / "model.onnx", warmup=1, runs=3)["runs"]  # a bundle without golden outputs
    assert old["verify"]["passed"] is None and "compile it again" in old["verify"]["reason"]
    assert "| n/a |" in table([old])


def test_bench_verifies_on_a_remote_target(bundle, adb, tmp_path):  # noqa: F811
    folder = _copy(bundle, tmp_path)
    _flip_weight(folder, "model.tflite")
    _list(folder, "model.tflite")
    runs = {r["model"]["file"]: r for r in bench(folder, fmt="tflite", target="adb:emulator-5554",
                                                   remote_python=sys.executable, warmup=1, runs=3)["runs"]}
    assert runs["model.tflite"]["verify"]["passed"] is False and not runs["model.tflite"]["verify"]["outputs_match"]
    assert runs["model.tflite"]["target"] == "adb:emulator-5554"
    assert all(r["verify"]["passed"] for n, r in runs.items() if n != "model.tflite")
    assert list(adb["phone"].iterdir()) == []  # verify's files went with the run's folder
