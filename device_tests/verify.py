"""The first-run check: does this model file, in this runtime on this machine, still give the outputs the
bundle was benchmarked with?

When a bundle is written, `golden` picks a few eval examples across the lengths and records, for every model
file, the outputs that file gives on them in its own runtime, with a tolerance: golden.json, listed in
manifest.json like every file. `python -m device_tests verify BUNDLE` (`run`) then checks each model file
with each runtime installed for it, and reports two things apart: whether its sha256 is the manifest's, and
whether its outputs on the golden examples are within tolerance. A changed file whose manifest entry was
changed with it passes the first and fails the second; a runtime or device that computes differently fails
the second alone. Plain JSON, so an app reads the same file (docs/embedding.md, "First-run check").
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np

from . import HarnessError, __version__, backends, device, files, runtimes
from .evalset import INPUTS

GOLDEN = "golden.json"
EXAMPLES = 8
# A file's tolerance is this share of the largest |output| it gives on the golden examples. Measured on the
# SST-2 default bundle (dynamic INT8, 200 dev examples, batch 1): x86-64 with AVX-512 VNNI against emulated
# aarch64 (qemu Cortex-A72, Cortex-A76) moved the logits by up to 0.78% of that (ONNX Runtime) and 0.63%
# (LiteRT, XNNPACK); float32 files by under 1e-6 of it; 1 against 2 threads and a repeated run, by nothing.
# 2% covers the INT8 kernels measured with room for ones that were not (ExecuTorch's XNNPACK on a phone).
RELATIVE = 0.02
NOISE = 10  # the tolerance is also at least this many times the run-to-run spread measured when writing it
LABELED = ("classification", "pair-classification", "token-classification")  # task kinds read by argmax


def pick(lengths: np.ndarray, n: int = EXAMPLES) -> np.ndarray:
    """The rows of `n` examples spread evenly over the eval set sorted by length, shortest first (every row
    when there are fewer), so short and long inputs, and every TFLite signature they use, are covered."""
    order = np.argsort(lengths, kind="stable")
    if len(order) > n:
        order = order[np.round(np.linspace(0, len(order) - 1, n)).astype(int)]
    return order


def _rows(outputs: np.ndarray, lengths) -> list[np.ndarray]:
    """One array per example: its output row, or its real tokens' rows for per-token outputs."""
    return [out[:n] if outputs.ndim == 3 else out for out, n in zip(outputs, lengths)]


def _flat(rows: list[np.ndarray]) -> np.ndarray:
    """Every prediction's scores, one per row: an example's, or each real token's."""
    return np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows])


def _max_abs_diff(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest |got - want|; infinite when an output is not finite."""
    a, b = _flat(got), _flat(want)
    return float(np.abs(a - b).max()) if np.isfinite(a).all() else float("inf")


def _run(model: backends.Model, inputs: dict) -> list[np.ndarray]:
    """Outputs of each golden example alone at its own length: the path the harness's metric pass takes."""
    return _rows(backends.logits(model, inputs, batch_size=1), inputs["lengths"])


def golden(models: dict[str, Callable[[int], backends.Model]], arrays: dict, task: dict | None) -> dict:
    """golden.json's content: the examples `pick` takes from `arrays` (an eval set's right-padded columns with
    `lengths`) and, for each model file, its outputs on them and its tolerance. models: {file name: open(threads)}
    loading the file in the runtime its outputs are benchmarked in."""
    rows = pick(arrays["lengths"])
    lengths = arrays["lengths"][rows].astype(np.int32)
    inputs = {k: arrays[k][rows, : int(lengths.max())].astype(np.int32) for k in INPUTS if k in arrays}
    inputs["lengths"] = lengths
    labeled = task is not None and task["kind"] in LABELED
    found = {}
    for name, open_model in models.items():
        model = open_model(1)
        want = _run(model, inputs)
        if not np.isfinite(_flat(want)).all():
            raise HarnessError(f"{name} gives non-finite outputs on eval rows {rows.tolist()}: a file that "
                               "answers NaN or inf cannot be checked against; fix the model before bundling it")
        noise = max(_max_abs_diff(_run(model, inputs), want), _max_abs_diff(_run(open_model(2), inputs), want))
        scale = float(np.abs(_flat(want)).max())
        found[name] = {"runtime": model.name, "version": model.version, "output": model.output,
                       "tolerance": max(RELATIVE * scale, NOISE * noise), "scale": scale, "noise": noise,
                       "labels": labeled and want[0].shape[-1] > 1, "outputs": [w.tolist() for w in want]}
    examples = [{"row": int(r), "length": int(n), **{k: v[i, :n].tolist() for k, v in inputs.items() if k in INPUTS}}
                for i, (r, n) in enumerate(zip(rows, lengths))]
    return {"format": "edgebert-golden", "version": 1,
            "tolerance": f"per file: max(|output|) over the examples x {RELATIVE}, at least {NOISE} x the run-to-run "
                         "noise measured when written; each output of each example (each real token's, per-token "
                         "outputs) must be within it",
            "examples": examples, "files": found}


def inputs_of(record: dict) -> dict[str, np.ndarray]:
    """golden.json's examples as right-padded int32 arrays with `lengths`, as backends.logits takes them."""
    examples = record["examples"]
    lengths = np.array([e["length"] for e in examples], dtype=np.int32)
    names = [k for k in INPUTS if k in examples[0]]
    arrays = {k: np.zeros((len(examples), int(lengths.max())), np.int32) for k in names}
    for i, e in enumerate(examples):
        for k in names:
            arrays[k][i, : e["length"]] = e[k]
    arrays["lengths"] = lengths
    return arrays


def compare(got: list[np.ndarray], entry: dict) -> dict:
    """How outputs `got` (one array per golden example) stand against a file's golden entry: the largest
    |difference|, the tolerance, and for a classifier how many predictions took another label."""
    want = [np.asarray(w, dtype=np.float32) for w in entry["outputs"]]
    shapes = [list(g.shape) for g in got], [list(w.shape) for w in want]
    if shapes[0] != shapes[1]:
        raise HarnessError(f"it gives outputs of shape {shapes[0][0]} where golden.json has {shapes[1][0]}: it is "
                           "not the file the golden outputs were written for")
    diff = _max_abs_diff(got, want)
    found = {"max_abs_diff": diff, "tolerance": entry["tolerance"], "outputs_match": diff <= entry["tolerance"]}
    if entry["labels"]:
        a, b = _flat(got).argmax(-1), _flat(want).argmax(-1)
        found.update(labels_differ=int((a != b).sum()), predictions=len(b))
    return found


def _read(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise HarnessError(f"{what} {path} is unreadable ({e}): copy the bundle again") from None


def _bundle(path: str, manifest: str | None) -> tuple[str, str | None, str, dict, dict]:
    """(bundle folder, the one model file asked for or None, manifest path, its `files`, golden.json's content),
    each checked: bad input raises one line naming the fix."""
    if os.path.isdir(path):
        folder, only = path, None
    elif os.path.isfile(path):
        folder, only = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    else:
        raise HarnessError(f"{path} does not exist: pass a bundle folder (or a model file in one)")
    manifest = manifest or os.path.join(folder, "manifest.json")
    if not os.path.isfile(manifest):
        raise HarnessError(f"{folder} has no manifest.json: pass a bundle folder written by edgebert, or --manifest")
    record = _read(manifest, "manifest")
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
        raise HarnessError(f"manifest {manifest} has no 'files' mapping: pass a bundle's manifest.json")
    if "golden" not in record:
        raise HarnessError(f"{folder} was written before bundles held golden outputs (its manifest lists no "
                           f"{GOLDEN}): compile it again with this edgebert (`edgebert compile ... --resume` "
                           "rewrites the bundle from the finished stages)")
    name = record["golden"].get("file") if isinstance(record["golden"], dict) else None
    if not isinstance(name, str):
        raise HarnessError(f"manifest {manifest}: its 'golden' entry names no file: copy the bundle again")
    path = os.path.join(os.path.dirname(os.path.abspath(manifest)), name)
    if not os.path.isfile(path):
        raise HarnessError(f"{path} is missing, which the manifest lists: copy the whole bundle again")
    if files.sha256(path) != record["files"].get(name, {}).get("sha256"):
        raise HarnessError(f"{path} sha256 differs from the manifest: the reference outputs were changed; "
                           "copy the bundle again")
    return folder, only, manifest, record["files"], _read(path, "golden outputs")


def _names(record: dict, only: str | None, fmt: str | None, backend: str | None) -> list[str]:
    """The model files to check: the one asked for, else every one golden.json holds, of `fmt`/`backend`'s format."""
    names = list(record["files"])
    if only is not None:
        if only not in names:
            raise HarnessError(f"{only} has no golden outputs in {GOLDEN}: pass a model file of that bundle "
                               f"({', '.join(names)})")
        names = [only]
    for flag, value, suffix in (("--format", fmt, fmt and runtimes.formats().get(fmt)),
                                ("--backend", backend, backend and runtimes.get(backend).suffix)):
        if value:
            names = [n for n in names if runtimes.suffix_of(n) == suffix]
            if not names:
                raise HarnessError(f"{flag} {value}: the bundle has no {suffix} file with golden outputs; "
                                   f"it has {', '.join(record['files'])}")
    return names


def _check(path: str, name: str, runtime: runtimes.Runtime, entry: dict, listed: dict, inputs: dict,
           accelerators: dict) -> dict:
    """One model file in one runtime: its sha256 against the manifest and, whatever that says, its outputs."""
    found = {"file": name, "backend": runtime.name, "version": None, "manifest_sha256": listed.get("sha256")}
    if not os.path.isfile(path):
        return {**found, "passed": False, "error": f"{name} is missing: copy the whole bundle again"}
    found["sha256"] = files.sha256(path)
    found["sha256_matches"] = found["sha256"] == found["manifest_sha256"]
    given = {k: v for k, v in accelerators.items() if v and k == runtime.accelerator_flag}
    try:
        model = backends.load(path, runtime.name, 1, **given)
        found.update(version=model.version, accelerator=model.accelerator)
        found.update(compare(_run(model, inputs), entry))
    except HarnessError as e:
        found["error"] = str(e)
    except Exception as e:  # noqa: BLE001  a changed file may fail inside the runtime: that is the finding
        first = (str(e).splitlines() or [""])[0][:200]
        found["error"] = f"{runtime.name} failed running it ({type(e).__name__}: {first})"
    found["passed"] = found["sha256_matches"] and found.get("outputs_match", False)
    return found


def line(check: dict) -> str:
    """PASS/FAIL, the file and runtime, then the hash and the outputs, each with its own verdict."""
    where = f"{check['file']} ({check['backend']}{' ' + check['version'] if check['version'] else ''})"
    head = f"{'PASS' if check['passed'] else 'FAIL'} {where}: "
    if "sha256" not in check:
        return head + check["error"]
    text = head + ("sha256 matches the manifest" if check["sha256_matches"] else "sha256 differs from the manifest")
    if "error" in check:
        return f"{text}; outputs: {check['error']}"
    ok = check["outputs_match"]
    text += (f"; outputs {'within' if ok else 'OUTSIDE'} tolerance: max |diff| {check['max_abs_diff']:.3g} "
             f"{'<=' if ok else '>'} tol {check['tolerance']:.3g}")
    if "labels_differ" in check:
        text += f", {check['labels_differ']} of {check['predictions']} labels differ"
    return text


def run(args) -> dict:
    """Everything `python -m device_tests verify` checks, as the result dict (`line` prints each check)."""
    if args.backend and not runtimes.get(args.backend).installed():
        raise HarnessError(f"--backend {args.backend} is not installed here: pip install "
                           f"{runtimes.get(args.backend).install}, or drop --backend to use what is")
    folder, only, manifest, listed, record = _bundle(args.bundle, args.manifest)
    inputs = inputs_of(record)
    accelerators = {"provider": args.provider, "delegate": args.delegate}
    checks, skipped = [], []
    for name in _names(record, only, args.format, args.backend):
        path = args.bundle if only else os.path.join(folder, name)
        found = [runtimes.get(args.backend)] if args.backend else [r for r in runtimes.for_file(name) if r.installed()]
        if not found:
            install = " or ".join(r.install for r in runtimes.for_file(name))
            skipped.append({"file": name, "reason": f"no runtime for it is installed here: pip install {install}"})
        for runtime in found:
            checks.append(_check(path, name, runtime, record["files"][name], listed.get(name, {}), inputs,
                                 accelerators))
    if not checks:
        raise HarnessError(f"nothing to check: {'; '.join(s['file'] + ': ' + s['reason'] for s in skipped)}")
    return {"harness": __version__, "complete": True, "passed": all(c["passed"] for c in checks),
            "bundle": folder, "manifest": manifest, "examples": len(record["examples"]), "device": device.describe(),
            "checks": checks, "skipped": skipped}
