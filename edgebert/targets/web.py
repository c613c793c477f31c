"""The `web` target: model.onnx in ONNX Runtime Web (WASM, SIMD, 1 thread) inside headless Chromium, driven
through the example app (examples/web/harness.html).

A small HTTP server on 127.0.0.1 serves the app, the model with its manifest and golden outputs, and a job;
the page runs the first-run check, times the eval set's inputs (batch 1, each at its own length) and POSTs
what it measured back; the metric is scored here, by the harness's own code. The device is the browser, so
results name it ("Chromium 156.0.8078.114 (WASM, SIMD, 1 thread)"): browser latency, not native.
`drive` is the same round trip for any job (tests/test_web.py classifies text through it).
"""

from __future__ import annotations

import http.server
import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..device_tests import HarnessError, __version__, backends, device, files, manifest
from ..device_tests.evalset import EvalSet, metric
from ..device_tests.harness import latency_stats
from .job import BenchError, Job
from .local import Local

APP = Path(__file__).resolve().parents[2] / "examples" / "web"  # the example app, in an edgebert checkout
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
LIMIT_S = 600  # how long a job may take when bench gives no --timeout
# The warm-up lasts at least this long, whatever --warmup says: V8 first compiles WebAssembly with its baseline
# compiler and moves hot functions to the optimizing one in the background as they run. On the SST-2 default
# model.onnx (2 busy cores), runs of 25 had p50 19.7 ms at the start, 8 ms after 1 s, a steady 3-3.6 ms after
# 2.5 s (300 runs); with the optimizing compiler forced from the start (--no-liftoff), 3.2 ms from the first run.
WARMUP_S = 5.0
ISOLATED = {  # a cross-origin-isolated page gets performance.now() at 5 us, not 100 us
    "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
    "Cache-Control": "no-store"}
REFUSED = (  # settings bench passes that the browser run does not honour: (setting, its default, why)
    ("threads", 1, "ORT Web runs 1 thread here"), ("batch", 1, "the page runs batch 1"),
    ("pad_to", None, "the page runs each example at its own length"),
    ("provider", None, "the page runs the WASM backend"), ("delegate", None, "the page runs no LiteRT"))


def chromium() -> str:
    """Chromium's path, or one line saying how to get it."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    raise BenchError("web: no Chromium on PATH (looked for chromium, google-chrome): apt-get install chromium")


def app() -> Path:
    """The example app folder with its npm packages, or one line saying what is missing."""
    if not (APP / "harness.html").is_file():
        raise BenchError(f"web: the example app is not at {APP}: the web target runs from an edgebert checkout "
                         "(pip install -e .)")
    for package in ("onnxruntime-web", "@huggingface/tokenizers"):
        if not (APP / "node_modules" / package / "package.json").is_file():
            raise BenchError(f"web: {APP} lacks node_modules/{package}: run `npm ci` there")
    return APP


@contextmanager
def serve(job: dict, served: dict[str, Path]):
    """(base URL, a queue that gets the page's report) while a server on 127.0.0.1 serves the app at /,
    `served` ({name: file}) under /bundle/ and `job` at /job.json, and takes the report at POST /report."""
    body = json.dumps({**job, "report": "/report"}).encode()
    reports: queue.Queue = queue.Queue()
    folder = str(app())

    class Handler(http.server.SimpleHTTPRequestHandler):
        extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                          ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm"}

        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=folder, **kwargs)

        def end_headers(self):
            for key, value in ISOLATED.items():
                self.send_header(key, value)
            super().end_headers()

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/job.json":
                return self._send(body, "application/json")
            if path.startswith("/bundle/"):
                name = path[len("/bundle/"):]
                if name not in served:
                    return self.send_error(404)
                return self._send(Path(served[name]).read_bytes(), self.guess_type(name))
            return super().do_GET()

        def do_POST(self):
            reports.put(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(204)
            self.end_headers()

        def _send(self, data: bytes, kind: str):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", reports
    finally:
        server.shutdown()
        server.server_close()


def _console(log: Path) -> str:
    """The page's last console message in Chromium's log: why a page that never reported stopped."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "CONSOLE" in ln]
    return f" (its console: {lines[-1].split('] ', 1)[-1][:300]})" if lines else ""


def drive(job: dict, served: dict[str, Path], timeout: float = LIMIT_S) -> dict:
    """Run `job` in examples/web/harness.html in headless Chromium and return what the page reports
    (harness.js says what a job holds); a page error or no report within `timeout` is one BenchError line."""
    browser, _ = chromium(), app()
    with tempfile.TemporaryDirectory(prefix="edgebert-web-") as tmp, serve(job, served) as (url, reports):
        log = Path(tmp) / "chromium.log"
        cmd = [browser, "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
               "--disable-extensions", "--disable-background-networking", "--disable-component-update",
               "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
               f"--user-data-dir={Path(tmp) / 'profile'}", "--enable-logging=stderr", "--v=0"]
        if os.geteuid() == 0:
            cmd.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox
        with open(log, "wb") as sink:
            proc = subprocess.Popen([*cmd, f"{url}/harness.html?job=/job.json"], stdout=sink, stderr=sink,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                report = _wait(reports, proc, timeout)
                if report is None:
                    why = (f"Chromium exited ({proc.returncode})" if proc.poll() is not None
                           else f"no result within {timeout:g} s")
                    raise BenchError(f"web: {why}{_console(log)}; no results (raise --timeout)")
            finally:
                _stop(proc)
    if "error" in report:
        raise BenchError(f"web: the page failed: {report['error']}")
    return report


def _wait(reports: queue.Queue, proc: subprocess.Popen, timeout: float) -> dict | None:
    """The page's report; None when Chromium exits without one or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return json.loads(reports.get(timeout=min(1.0, max(0.0, deadline - time.monotonic()))))
        except queue.Empty:
            continue
    return None


def _stop(proc: subprocess.Popen) -> None:
    """End the Chromium this module started, with the processes it spawned (its own process group)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Web(Local):
    """`web`: ORT Web in headless Chromium on this machine. A Local, so bench runs it in this machine's lane,
    one target at a time: the browser shares these cores with local and qemu runs."""

    def __init__(self):
        self.name = "web"
        chromium()
        app()

    def run(self, job: Job) -> dict:
        for key, default, why in REFUSED:
            if job.settings.get(key, default) != default:
                raise BenchError(f"web: --{key.replace('_', '-')} {job.settings[key]}: {why}; drop it")
        digest = files.sha256(job.model)
        try:
            verified, unverified = manifest.check(str(job.model), digest, str(job.manifest) if job.manifest else None)
            if verified["manifest"]:
                manifest.verify(verified["manifest"], str(job.inputs), files.sha256(job.inputs))
            data = EvalSet(str(job.inputs))
        except HarnessError as e:
            raise BenchError(f"web: {e}") from None
        served = {job.model.name: job.model, "manifest.json": job.manifest, "golden.json": job.golden}
        inputs = {k: [row[:n].tolist() for row, n in zip(a, data.lengths)] for k, a in data.arrays.items()}
        page = drive({"bundle": "/bundle/", "model": job.model.name, "inputs": inputs,
                      "warmup": job.settings["warmup"], "warmup_s": WARMUP_S, "runs": job.settings["runs"],
                      "duration": job.settings.get("duration")},
                     {k: v for k, v in served.items() if v}, job.limit or LIMIT_S)
        return self._result(job, page, data, digest, verified, unverified)

    @staticmethod
    def _result(job: Job, page: dict, data: EvalSet, digest: str, verified: dict, unverified: str | None) -> dict:
        """The page's measurements in the harness's result shape, scored here as the harness scores."""
        timed = page["bench"]
        outputs = [(slice(i, i + 1), np.asarray(o["values"], np.float32).reshape(o["dims"]))
                   for i, o in enumerate(timed["outputs"])]
        logits = backends.place(outputs, data.n, data.arrays["input_ids"].shape[1])
        fields, warnings = {}, [w for w in (unverified,) if w]
        if data.labels is not None:
            scores, predictions = metric(logits, data.labels, data.task)
            fields.update(task=data.task["kind"], metric=data.task["metric"], **scores, predictions=predictions)
        else:
            warnings.append(f"{job.inputs} has no labels: no task metric")
        if job.settings.get("logits"):
            fields["logits"] = logits.astype(np.float64).tolist()
        if page["sha256"] not in (None, digest):
            warnings.append(f"the browser loaded {job.model.name} with sha256 {page['sha256'][:12]}…, not the "
                            f"file's {digest[:12]}…: it changed while the run served it")
        if not page["cross_origin_isolated"]:
            warnings.append("the page was not cross-origin isolated: its clock ticks in 0.1 ms")
        ms = timed["latency_runs_ms"]
        browser = f"{page['browser']} (WASM, SIMD, 1 thread)"
        result = {
            "harness": __version__, "emulated": False, "complete": True,
            "device": {"architecture": "wasm32", "cpu_model": browser, "browser": page["browser"],
                       "user_agent": page["user_agent"], "host": device.describe()},
            "runtime": {"backend": "onnxruntime-web", "version": page["onnxruntime_web"], "wasm": "simd",
                        "threads": 1, "browser": page["browser"], "python": platform.python_version()},
            "model": {"file": job.model.name, "bytes": job.model.stat().st_size, "sha256": digest, **verified},
            "settings": {"threads": 1, "warmup": timed["warmup_runs"], "warmup_s": WARMUP_S, "runs": len(ms),
                         "duration_s": job.settings.get("duration"), "batch": 1, "pad_to": None, "truncate": False},
            "load_ms": timed["load_ms"], "first_inference_ms": timed["first_inference_ms"],
            "latency_ms": latency_stats(ms), "latency_runs_ms": [round(x, 4) for x in ms],
            "throughput": len(ms) / (sum(ms) / 1000), "peak_rss_mb": None, "n_examples": data.n,
            **fields,
            "warnings": warnings + [f"browser latency: ONNX Runtime Web {page['onnxruntime_web']} in {browser}, "
                                    "not native ONNX Runtime"],
        }
        if job.golden:
            result["verify"] = page["check"]
        return result
