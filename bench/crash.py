"""Issue 33's real check: SIGKILL `edgebert compile --quick` at random points, resume each with --resume, and
compare every resumed bundle's files with an uninterrupted run's, byte for byte.

    python bench/crash.py [--kills 20] [--seed 0] [--work runs/crash] [--results bench/results]

Each kill is a real quick compile (the README's second command, on the data it finds as a user's would), started
in WORK/<n>, killed with SIGKILL a seeded-random number of seconds in (between 2 s and the uninterrupted run's
wall time, so it lands in any stage, the teacher cache and the bundle write included), then run again with
--resume to the end. A compile that ends before its kill is not a kill: it starts again with a new draw within
the time that run took, so every kill interrupts a running compile (`redrawn` counts them). A kill is clean when
nothing half-written is left outside OUT/work and the resumed bundle's files (manifest.json's list, less
report.html, which holds wall times) have the uninterrupted run's sha256s.
Writes RESULTS/crash-quick.json and prints one line per kill.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from _figures import commit
from edgebert.device_tests.files import write_json

ROOT = Path(__file__).resolve().parents[1]
TIMED = {"report.html"}  # holds the run's wall times, which differ between any two runs


def compile_quick(out: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgebert", "compile", "--quick", "--out", str(out), *flags],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def files(out: Path) -> dict[str, str]:
    """The bundle's files by sha256, as its manifest lists them, less the timed report."""
    listed = json.loads((out / "bundle" / "manifest.json").read_text())["files"]
    return {name: entry["sha256"] for name, entry in listed.items() if name not in TIMED}


def half_written(out: Path) -> list[str]:
    """Temporary files and folders outside OUT/work: what a kill must not leave where readers look."""
    return sorted(str(p.relative_to(out)) for pattern in (".*.tmp", ".*.old") for p in out.rglob(pattern)
                  if p.relative_to(out).parts[0] != "work")


def finish(run: subprocess.Popen, what: str) -> None:
    _, err = run.communicate()
    if run.returncode != 0:
        sys.exit(f"crash: {what} failed (exit {run.returncode}): {err.strip().splitlines()[-1] if err.strip() else ''}")


def ended_in(run: subprocess.Popen, delay: float) -> float | None:
    """SIGKILL the run `delay` seconds in, and None; or, when it ended first, the seconds it took."""
    t0 = time.monotonic()
    try:
        run.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        run.send_signal(signal.SIGKILL)
        run.wait()
        return None
    run.communicate()
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="runs/crash")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    work = (ROOT / args.work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.monotonic()
    finish(compile_quick(work / "whole"), "the uninterrupted compile")
    whole_s, whole = time.monotonic() - t0, files(work / "whole")
    print(f"uninterrupted: {whole_s:.0f} s, {len(whole)} files", flush=True)
    rng, kills = random.Random(args.seed), []
    for n in range(args.kills):
        out, delay, redrawn = work / str(n), round(rng.uniform(2.0, whole_s), 1), 0
        while (ran_s := ended_in(compile_quick(out), delay)) is not None:  # the next draw lands inside that run
            shutil.rmtree(out)
            delay, redrawn = round(rng.uniform(2.0, ran_s), 1), redrawn + 1
        stages = sorted(p.name.split("-")[1] for p in (out / "stages").glob("*-*")) if (out / "stages").is_dir() else []
        left = half_written(out)
        t1 = time.monotonic()
        finish(compile_quick(out, "--resume"), f"kill {n}'s resume")
        same = files(out) == whole
        kills.append({"kill": n, "after_s": delay, "redrawn": redrawn, "stages_done": stages,
                      "half_written_outside_work": left, "resume_s": round(time.monotonic() - t1, 1),
                      "same_files": same})
        again = f", {redrawn} redrawn" if redrawn else ""
        print(f"kill {n}: SIGKILL at {delay:.1f} s ({len(stages)} stages done{again})"
              f"; half-written outside work: {left or 'none'}; resumed bundle {'identical' if same else 'DIFFERS'}",
              flush=True)
        shutil.rmtree(out)
    clean = sum(k["same_files"] and not k["half_written_outside_work"] for k in kills)
    write_json(Path(args.results) / "crash-quick.json",
               {"command": f"python bench/crash.py --kills {args.kills} --seed {args.seed}", "commit": commit(),
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "uninterrupted_s": round(whole_s, 1),
                "files": whole, "kills": kills, "clean": clean, "os_cpus": os.cpu_count()})
    print(f"{clean} of {len(kills)} kills clean: nothing half-written outside OUT/work, resumed bundle identical")
    sys.exit(0 if clean == len(kills) else 1)


if __name__ == "__main__":
    main()
