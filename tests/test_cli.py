"""`edgebert` as a person and a CI script see it: a fast --help, --version, a compile whose screen
holds only edgebert's own lines (the libraries' chatter in OUT/edgebert.log), `--json` on stdout,
`--quiet`, and a resume of a finished output that changes nothing."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


RECIPE = """
task = "sst2"
model = "{model}"
max_length = 16
stages = ["finetune", "quantize", "export"]
[finetune.train]
steps = 4
batch_size = 8
[quantize]
accuracy_budget = 50.0
calibration_size = 8
[export]
formats = ["onnx", "tflite"]
seq_lens = [16]
"""


def _edgebert(*argv, cwd=None):
    # TF_CPP_MIN_LOG_LEVEL: jax sets it to 1 on import, so once a test in this process has converted a TFLite
    # file, a child would inherit it and the converter's absl lines, which the log must hold, would not be said
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="0")
    return subprocess.run([sys.executable, "-m", "edgebert.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_help_is_fast_and_imports_no_torch():
    code = ("import sys, time; t = time.perf_counter(); from edgebert.cli import parser; parser().format_help(); "
            "print(time.perf_counter() - t, 'torch' in sys.modules)")
    seconds, torch_loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                           check=True).stdout.split()
    assert torch_loaded == "False" and float(seconds) < 0.5
    t0 = time.perf_counter()
    proc = _edgebert("--help")
    assert proc.returncode == 0 and "compile" in proc.stdout and time.perf_counter() - t0 < 2.0  # with the interpreter
    version = _edgebert("--version")
    assert version.returncode == 0 and version.stdout.strip().startswith("edgebert 0.")


def _snapshot(bundle):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(bundle.iterdir())}


@pytest.fixture(scope="module")
def compiled(tiny_checkpoint, tiny_sst2, tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    (root / "recipe.toml").write_text(RECIPE.format(model=tiny_checkpoint))
    proc = _edgebert("compile", "recipe.toml", "--out", "out", "--data", tiny_sst2, "--json", cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root, proc


def test_compile_screen_holds_only_edgebert(compiled):
    root, proc = compiled
    summary = json.loads(proc.stdout)  # stdout is the JSON summary and nothing else
    assert [s["stage"] for s in summary["stages"]] == ["finetune"]
    assert {f["file"] for f in summary["files"]} == {"model.onnx", "model.tflite"}
    assert all(f["p50_ms"] > 0 and 0 <= f["accuracy"] <= 100 for f in summary["files"])
    assert "\r" not in proc.stderr  # no progress-bar frames off a terminal
    for line in proc.stderr.splitlines():
        assert line.startswith(("edgebert: ", "step ")), line
    log = (root / "out" / "edgebert.log").read_text()
    assert "XNNPACK delegate" in log and "absl" in log  # what the libraries said is kept, off the screen


def test_resume_of_a_finished_output_changes_nothing(compiled, tiny_sst2):
    root, _ = compiled
    bundle = root / "out" / "bundle"
    before = _snapshot(bundle)
    proc = _edgebert("compile", "recipe.toml", "--out", "out", "--data", tiny_sst2, "--resume", cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert "bundle: up to date" in proc.stderr and "bench:" not in proc.stderr
    assert _snapshot(bundle) == before  # every file, byte for byte, and its mtime

    proc = _edgebert("--quiet", "compile", "recipe.toml", "--out", "out", "--data", tiny_sst2, "--resume",
                     "--rebench", cwd=root)
    assert proc.returncode == 0 and proc.stderr == ""  # --quiet: progress went to the log
    assert "stage" in proc.stdout  # the summary table still
    after = _snapshot(bundle)
    assert after["model.onnx"][0] == before["model.onnx"][0]  # same files, fresh timings
    old, new = (json.loads(s["manifest.json"][0])["bench_local"]["model.onnx"] for s in (before, after))
    assert old["latency_ms"] != new["latency_ms"]
    assert "edgebert: bench: model.onnx on local" in (root / "out" / "edgebert.log").read_text()


def test_errors_stay_one_line_on_stderr(compiled, tiny_sst2):
    root, _ = compiled
    proc = _edgebert("compile", "recipe.toml", "--out", "out", "--data", tiny_sst2, cwd=root)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("edgebert: error: output folder")
    proc = _edgebert("compile", "recipe.toml", "--out", "out", "--data", tiny_sst2, "--resume", "--rebench",
                     "--no-bench", cwd=root)
    assert proc.returncode == 2 and "--rebench asks for fresh timings" in proc.stderr


def test_inspect_says_which_delegates_could_take_a_tflite_file(tiny):
    proc = _edgebert("inspect", tiny["int8"] / "model.tflite")
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert lines["integer-npu"].startswith("not whole: needs full-integer ops") and "hybrid: EMBEDDING_LOOKUP x6, FULLY_CONNECTED x6" in lines["integer-npu"]
    assert json.loads(_edgebert("inspect", tiny["int8"] / "model.tflite", "--json").stdout)["ops"]["hybrid"] > 0
    bad = _edgebert("inspect", tiny["bundle"] / "eval.npz.tflite")
    assert bad.returncode == 2 and bad.stderr.startswith("edgebert: error: cannot read")


def test_quick_says_what_it_trades_away(tmp_path):
    proc = _edgebert("compile", "--quick", "--out", tmp_path / "out", "--data", tmp_path)  # no data: stops early
    assert proc.returncode == 2 and "sst2" in proc.stderr.splitlines()[-1]
    assert "--quick trains on 3,000 SST-2 sentences" in proc.stderr and "not a model to ship" in proc.stderr
    (tmp_path / "mine.csv").write_text("text,label\n")  # the user's own task: the banner names it
    proc = _edgebert("compile", "--quick", "--task", tmp_path / "mine.csv", "--out", tmp_path / "out")
    assert proc.returncode == 2 and f"--quick trains on at most 3,000 examples of {tmp_path / 'mine.csv'} for" \
        in proc.stderr and "SST-2" not in proc.stderr


@pytest.mark.parametrize("flags", [["--device", "cuda"], ["--device", "cuda:3"], ["--device", "mps"],
                                   ["--device", "gpu"], ["--precision", "fp16"]])
def test_a_device_this_machine_lacks_is_one_line_before_any_work(flags, tmp_path):
    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU")
    proc = _edgebert("compile", "--out", tmp_path / "out", *flags)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("edgebert: error: ")
    assert not (tmp_path / "out").exists()


def _training(checkpoint, data, folder, **popen):
    """A compile into folder/out that trains for as long as it is let, started, and waited for until its first
    stage is being written."""
    (folder / "recipe.toml").write_text(RECIPE.format(model=checkpoint).replace("steps = 4", "steps = 100000"))
    run = subprocess.Popen([sys.executable, "-m", "edgebert.cli", "compile", "recipe.toml", "--out", "out", "--data",
                            data], cwd=folder, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                           **popen)
    deadline = time.monotonic() + 120
    while not list(folder.glob("out/work/.*-finetune-*.tmp")):
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    return run


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_stop_a_compile_at_once_leaving_nothing_half_written(sig, tiny_checkpoint, tiny_sst2,
                                                                                tmp_path):
    # started as a shell starts a background job: SIGINT ignored, which edgebert overrides
    run = _training(tiny_checkpoint, tiny_sst2, tmp_path, stderr=subprocess.PIPE, text=True,
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    t0 = time.monotonic()
    run.send_signal(sig)
    try:
        _, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 130 and time.monotonic() - t0 < 5
    assert err.splitlines()[-1].startswith("edgebert: interrupted (finished stages are kept")
    assert not list((tmp_path / "out").rglob(".*.tmp"))


def test_one_compile_per_output_folder_and_a_killed_ones_lock_and_litter_go(tiny_checkpoint, tiny_sst2, tmp_path):
    from edgebert.pipeline.compile import _claimed

    out = tmp_path / "out"
    first = _training(tiny_checkpoint, tiny_sst2, tmp_path, stderr=subprocess.DEVNULL)
    try:
        second = _edgebert("compile", "recipe.toml", "--out", out, "--data", tiny_sst2, "--resume", cwd=tmp_path)
        assert second.returncode == 2 and second.stderr.splitlines()[-1] == (
            f"edgebert: error: output folder {out} is in use by another compile: wait for it to finish, or pass "
            "another --out")
    finally:
        first.kill()
        first.wait()
    assert list(out.glob("work/.*-finetune-*.tmp")) and not list(out.glob("stages/.*"))  # the kill's, in work/
    with _claimed(out, resume=True, force=False):  # the lock went with the process; the litter goes now
        assert not list(out.rglob(".*.tmp")) and (out / "edgebert.log").is_file()


def test_an_interrupt_a_library_turned_into_its_own_error_is_still_an_interrupt(monkeypatch, capsys):
    """Ctrl-C during the import of a C extension surfaces as onnxruntime's ImportError("initialization failed")
    raised from the KeyboardInterrupt: that is exit 130 and the resume advice, not an internal error."""
    from edgebert import cli

    def import_interrupted(args):
        try:
            raise KeyboardInterrupt("SIGINT")
        except KeyboardInterrupt as e:
            raise ImportError("initialization failed") from e

    monkeypatch.setattr(cli, "_compile", import_interrupted)
    assert cli.main(["compile", "--quick"]) == 130
    assert capsys.readouterr().err.splitlines()[-1].startswith("edgebert: interrupted (finished stages are kept")
