"""Crash consistency, tested the way SQLite tests it: stop a compile at many points with SIGKILL, SIGTERM or
SIGINT, then run it again with --resume. Ctrl-C and SIGTERM stop it within seconds; no signal leaves a
half-written file anywhere but OUT/work; and the resumed run's bundle holds the same model files, byte for byte,
as an uninterrupted run's. The default suite kills at a few points; `-m slow` at 20 random ones."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

RECIPE = """
task = "sst2"
model = "{model}"
max_length = 16
stages = ["finetune", "distill", "quantize", "export"]
[finetune.train]
steps = 400
batch_size = 8
eval_every = 100
[distill]
layers = 1
[distill.train]
steps = 400
batch_size = 8
eval_every = 100
[quantize]
accuracy_budget = 50.0
calibration_size = 8
[export]
formats = ["onnx"]
seq_lens = [16]
bench = false
"""
TIMED = {"report.html"}  # holds the run's wall times, which differ between any two runs


def _start(folder, data, *flags):
    return subprocess.Popen([sys.executable, "-m", "edgebert.cli", "compile", "recipe.toml", "--out", "out",
                             "--data", data, *flags], cwd=folder, env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _files(out) -> dict[str, str]:
    """The bundle's files by sha256, as its manifest lists them, less the timed report."""
    files = json.loads((out / "bundle" / "manifest.json").read_text())["files"]
    return {name: entry["sha256"] for name, entry in files.items() if name not in TIMED}


def _half_written(out) -> list[str]:
    """Temporary files and folders outside OUT/work: what a crash must not leave where readers look."""
    return sorted(str(p.relative_to(out)) for pattern in (".*.tmp", ".*.old") for p in out.rglob(pattern)
                  if p.relative_to(out).parts[0] != "work")


@pytest.fixture(scope="module")
def uninterrupted(tiny_checkpoint, tiny_sst2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("whole")
    (folder / "recipe.toml").write_text(RECIPE.format(model=tiny_checkpoint))
    t0 = time.monotonic()
    run = _start(folder, tiny_sst2)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-2000:]
    return folder, _files(folder / "out"), time.monotonic() - t0


def _crash_then_resume(uninterrupted, tiny_sst2, folder, sig: signal.Signals, when: str, delay: float) -> None:
    """Start a compile, send `sig` `delay` seconds after a path matching `when` (a glob under `folder`)
    appears, then resume it."""
    _, whole, _ = uninterrupted
    (folder / "recipe.toml").write_text((uninterrupted[0] / "recipe.toml").read_text())
    run = _start(folder, tiny_sst2)
    try:
        deadline = time.monotonic() + 300
        while not list(folder.glob(when)):
            assert run.poll() is None and time.monotonic() < deadline, f"the run ended before {when} appeared"
            time.sleep(0.05)
        time.sleep(delay)
        run.send_signal(sig)
        t0 = time.monotonic()
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    if sig != signal.SIGKILL and run.returncode != 0:  # 0: it finished before the signal came
        assert run.returncode == 130 and time.monotonic() - t0 < 5, err[-2000:]
    out = folder / "out"
    assert _half_written(out) == [], f"{sig.name} {delay:.1f} s after {when}"
    resumed = _start(folder, tiny_sst2, "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-2000:]
    assert not list(out.rglob(".*.tmp")) and not list(out.rglob(".*.old"))  # the resume swept what the crash left
    assert _files(out) == whole, f"{sig.name} {delay:.1f} s after {when}: the resumed bundle differs"


STAGE = "out/work/.*-{}-*.tmp"  # a stage's folder while it is written


@pytest.mark.parametrize("sig, when, delay", [
    (signal.SIGKILL, STAGE.format("finetune"), 1.5),  # mid-training: resumes from the pass's saved state
    (signal.SIGTERM, STAGE.format("distill"), 0.2),  # while the teacher cache and the student start
    (signal.SIGINT, STAGE.format("quantize"), 0.1),
    (signal.SIGKILL, "out/work/.bundle.*.tmp", 0.0),
], ids=["kill-finetune", "term-distill", "int-quantize", "kill-bundle"])
def test_a_compile_stopped_at_any_point_resumes_to_the_same_bundle(sig, when, delay, uninterrupted, tiny_sst2,
                                                                    tmp_path):
    _crash_then_resume(uninterrupted, tiny_sst2, tmp_path, sig, when, delay)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_sigkill_at_random_points_of_20_compiles(seed, uninterrupted, tiny_sst2, tmp_path):
    delay = random.Random(seed).uniform(0, uninterrupted[2] * 0.6)  # from the output folder's start to near the end
    _crash_then_resume(uninterrupted, tiny_sst2, tmp_path, signal.SIGKILL, "out/work", delay)
