"""report.html answers the user's questions: every stage through the files in points, p50/p90/p99, load
time and peak RSS, agreement with PyTorch, the latency distribution, the op profile, a confusion matrix,
machine and versions, baselines when present; and it renders in a real headless browser."""

import re
import shutil
import statistics
import subprocess
from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import pytest

from edgebert.bench import recommended_threads
from edgebert.export import OnnxExportConfig, export
from edgebert.pipeline import compile as compiler
from edgebert.pipeline.bundle import read_bundle, write_bundle
from edgebert.pipeline.report import baselines, error_breakdown, render

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'edgebert[convert]')")

LABELS = ["negative", "positive"]
STAGES = [{"name": "finetune", "params": {"total": 1_234_567, "epochs": 3}, "bytes": 4_900_000, "flops": 2_100_000,
           "metrics": {"accuracy": 0.8154, "f1": 0.8012}},
          {"name": "distill", "params": {"total": 654_321}, "bytes": 2_600_000, "flops": 1_050_000,
           "metrics": {"accuracy": 0.80125, "f1": 0.79}}]
COMPARE = {"command": "python bench/compare.py", "date": "2026-11-30T11:42:05+00:00",
           "machine": {"cpu_model": "AMD EPYC", "architecture": "x86_64", "cores": 2},
           "baseline_2": {"t1": {"real": "optimum-o2-int8"}},
           "models": {"pytorch-fp32": {"label": "teacher · PyTorch FP32", "bytes": 90_867_952,
                                       "accuracy": {"real": {"accuracy": 0.90137}}},
                      "optimum-o2-int8": {"label": "teacher · Optimum ONNX O2 + dynamic INT8", "bytes": 22_992_324,
                                          "accuracy": {"real": {"accuracy": 0.89679}}},
                      "student-onnx-int8": {"label": "edgebert student · model.onnx", "bytes": 15_752_606,
                                            "accuracy": {"real": {"accuracy": 0.88303}}}},
           "timing": {"t1": {"real": {"pytorch-fp32": {"p50_ms": 27.56, "p90_ms": 34.57, "peak_rss_mb": 454.6,
                                                       "speedup_vs_2": 0.28},
                                      "optimum-o2-int8": {"p50_ms": 7.73, "p90_ms": 12.32, "peak_rss_mb": 104.5,
                                                          "speedup_vs_2": 1.0},
                                      "student-onnx-int8": {"p50_ms": 3.25, "p90_ms": 4.1, "peak_rss_mb": 80.2,
                                                            "speedup_vs_2": 2.38}}}}}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, tiny_classifier, tiny_tokenizer, tiny_arrays):
    """A bundle as `edgebert compile` writes it: an INT8 file from quantize and a float one from export,
    benched locally by the compile's own gathering code (harness runs, ORT profile, confusion matrix)."""
    from edgebert.quantize import DynamicInt8Config, quantize

    folder = tmp_path_factory.mktemp("report")
    tokenizer_dir = folder / "tokenizer"
    tiny_tokenizer.save_pretrained(tokenizer_dir)
    made = {"model.onnx": ("quantize", quantize(tiny_classifier, DynamicInt8Config(), out=folder / "model.onnx",
                                                eval_data=tiny_arrays)),
            "model-float.onnx": ("export", export(tiny_classifier, OnnxExportConfig(optimize="none"),
                                                  out=folder / "model-float.onnx", eval_data=tiny_arrays))}
    files = {name: a.path for name, (_, a) in made.items()}
    measured = compiler._bench_files(SimpleNamespace(out=folder, eval_arrays=tiny_arrays),
                                     SimpleNamespace(files=files), LABELS)
    points = [{"stage": s["name"], "format": "pytorch", "metric": s["metrics"]["accuracy"] * 100,
               "latency_ms": 1.0 + i, "bytes": s["bytes"], "metric_name": "accuracy"} for i, s in enumerate(STAGES)]
    points += [{"stage": "bundle", "format": name, "metric": m["metrics"]["accuracy"] * 100, "latency_ms": m["latency_ms"]["p50"],
                "bytes": files[name].stat().st_size, "metric_name": "accuracy"} for name, m in measured.items()]
    manifest = {"task": {"name": "sst2", "kind": "classification", "metric": "accuracy"}, "stages": STAGES,
                "verification": {name: {"stage": stage, "meta": a.meta, "verify": a.verification}
                                 for name, (stage, a) in made.items()},
                "bench_local": measured, "baselines": None}
    out = write_bundle(folder / "bundle", models=files, tokenizer_dir=tokenizer_dir, labels=LABELS,
                       eval_arrays=tiny_arrays, manifest=manifest, report_points=points)
    return out


class _Tables(HTMLParser):
    """Every table of a page as {id or n-th: [[cell text]]}, and the number of inline SVG charts."""

    def __init__(self, page: str):
        super().__init__()
        self.tables, self.svgs, self._rows, self._cell, self._id = {}, 0, None, None, None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._id, self._rows = dict(attrs).get("id") or dict(attrs).get("class") or str(len(self.tables)), []
        elif tag == "tr" and self._rows is not None:
            self._rows.append([])
        elif tag in ("td", "th") and self._rows is not None:
            self._cell = ""
        elif tag == "svg":
            self.svgs += 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._rows[-1].append(self._cell.strip())
            self._cell = None
        elif tag == "table" and self._rows is not None:
            key = self._id
            while key in self.tables:
                key += "+"
            self.tables[key], self._rows = self._rows, None


def _column(rows: list[list[str]], name: str) -> list[str]:
    i = rows[0].index(name)
    return [r[i] for r in rows[1:]]


def test_every_stage_through_the_files_in_points(bundle):
    page = _Tables((bundle / "report.html").read_text())
    stages = page.tables["stages"]
    assert [r[0] for r in stages[1:]] == ["finetune", "distill", "quantize", "export"]
    assert _column(stages, "accuracy (points)")[:2] == ["81.54", "80.12"]  # fractions become points, once
    assert "f1 80.12" in _column(stages, "Other metrics (points)")[0]
    manifest = read_bundle(bundle)
    for name, row in zip(("model.onnx", "model-float.onnx"), stages[3:]):
        check = manifest["verification"][name]["verify"]
        assert row[1].startswith(name)
        assert row[5] == f"{check['value'] * 100:.2f}" and row[6] == f"{check['agreement'] * 100:.2f}"
        assert float(row[7]) == pytest.approx(check["max_abs_diff"], rel=1e-2)
    for table in (stages, page.tables["files"], page.tables["pareto"]):  # no fraction left in a metric column
        for i, head in enumerate(table[0]):
            if "points" in head or "(%)" in head:
                values = [float(v) for r in table[1:] for v in re.findall(r"\d+\.\d+", r[i])]
                assert values and all(v > 1 for v in values), head


def test_files_show_tail_latency_load_time_memory_and_agreement(bundle):
    manifest = read_bundle(bundle)
    files = _Tables((bundle / "report.html").read_text()).tables["files"]
    assert {"p50 ms", "p90 ms", "p99 ms", "Load ms", "Peak RSS MB", "Agreement (%)", "max |diff|"} <= set(files[0])
    for row in files[1:]:
        bench = manifest["bench_local"][row[0]]
        for key in ("p50", "p90", "p99"):
            assert row[files[0].index(f"{key} ms")] == f"{bench['latency_ms'][key]:.3f}"
        assert row[files[0].index("Load ms")] == f"{bench['load_ms']:.3f}"
        assert float(row[files[0].index("Peak RSS MB")]) > 0
        assert len(bench["latency_runs_ms"]) == 50  # the harness returns every timed run


def test_each_file_is_timed_at_each_thread_count_and_the_bundle_names_one(bundle):
    manifest = read_bundle(bundle)
    files = _Tables((bundle / "report.html").read_text()).tables["files"]
    cores = next(iter(manifest["bench_local"].values()))["device"]["cores_usable"]
    for row in files[1:]:
        bench = manifest["bench_local"][row[0]]
        p50 = {int(n): ms for n, ms in bench["p50_ms_by_threads"].items()}
        rounds = {int(n): ms for n, ms in bench["p50_ms_rounds"].items()}
        assert sorted(p50) == sorted(rounds) == [n for n in (1, 2) if n <= cores]
        assert all(len(ms) == 3 and p50[n] == statistics.median(ms) for n, ms in rounds.items())  # in turns
        assert bench["latency_ms"]["p50"] == sorted(rounds[1])[1]  # the file's figures are its median 1-thread turn
        assert bench["recommended_threads"] == recommended_threads(p50)
        assert row[files[0].index("Threads to run it at")] == str(bench["recommended_threads"])
        assert row[files[0].index("p50 ms by threads")] == ", ".join(f"{n}: {ms:.3g}" for n, ms in p50.items())


def test_npu_providers_share_of_each_onnx_file_is_shown(bundle):
    manifest = read_bundle(bundle)
    page = _Tables((bundle / "report.html").read_text())
    rows = page.tables["providers"]
    onnx_files = [n for n in manifest["inputs"]["files"] if n.endswith(".onnx")]
    assert [(r[0], r[1]) for r in rows[1:]] == [(n, p) for n in onnx_files for p in ("NNAPI", "CoreML")]
    for row in rows[1:]:
        fit = manifest["inputs"]["files"][row[0]]["accelerators"][row[1].lower()]
        assert row[2] == f"{fit['fraction']:.0%} ({fit['taken']} of {fit['nodes']})" and 0 < fit["taken"] <= fit["nodes"]
        assert row[4] == ", ".join(fit["cpu_ops"])


def test_profile_confusion_matrix_machine_and_versions(bundle):
    manifest = read_bundle(bundle)
    page = _Tables((bundle / "report.html").read_text())
    profile = page.tables["profile"]
    assert profile[0][0] == "Op type" and {"MatMul", "Gemm", "MatMulInteger", "DynamicQuantizeMatMul"} & \
        {r[0] for r in profile[1:]}
    assert 1 < len(profile) <= 1 + 8 + 1  # the top ops, then one row for the rest
    confusion = page.tables["confusion"]
    assert confusion[0][1:3] == LABELS and [r[0] for r in confusion[1:]] == LABELS
    matrix = manifest["bench_local"]["model.onnx"]["errors"]["matrix"]
    assert sum(map(sum, matrix)) == 32 and int(confusion[1][1].split()[0]) == matrix[0][0]
    machine = dict(page.tables["machine"])
    assert machine["Threads"] == "1" and machine["CPU"] and "onnxruntime" in machine["Runtimes"]
    assert {"jinja2", "matplotlib", "onnxruntime"} <= {r[0] for r in page.tables["versions"][1:]}
    assert page.svgs == 2  # the trade-off chart and the latency distribution


def test_baselines_sit_beside_the_student_only_when_compare_results_exist(bundle):
    record = read_bundle(bundle)
    points = record["pareto"]
    without = _Tables(render(record, points))
    assert "baselines" not in without.tables
    table = _Tables(render({**record, "baselines": baselines(COMPARE)}, points)).tables["baselines"]
    assert [r[0] for r in table[1:]] == ["teacher · PyTorch FP32", "teacher · Optimum ONNX O2 + dynamic INT8",
                                         "edgebert student · model.onnx"]
    assert _column(table, "accuracy (points)") == ["90.14", "89.68", "88.30"]
    assert _column(table, "Speed-up vs optimum-o2-int8")[2] == "2.38×"


def test_compile_reads_compare_results_only_for_its_own_bundle(tmp_path):
    import json

    dest = tmp_path / "bundle"
    (tmp_path / "compare.json").write_text(json.dumps({**COMPARE, "inputs": {"bundle": str(tmp_path / "other")}}))
    assert compiler._baselines(tmp_path, dest) is None
    (tmp_path / "compare.json").write_text(json.dumps({**COMPARE, "inputs": {"bundle": str(dest)}}))
    assert compiler._baselines(tmp_path, dest)["rows"][1]["id"] == "optimum-o2-int8"


def test_compile_reads_the_repositorys_compare_results_wherever_it_runs(tmp_path, monkeypatch):
    import json

    dest, out = tmp_path / "bundle", tmp_path / "out"
    here = tmp_path / "cwd" / "bench" / "results"
    here.mkdir(parents=True)
    (here / "compare.json").write_text(json.dumps({**COMPARE, "inputs": {"bundle": str(dest)}}))
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(compiler, "COMPARE", tmp_path / "repository" / "compare.json")
    assert compiler._baselines(out, dest) is None  # the current directory's bench/ is not the project's
    monkeypatch.setattr(compiler, "COMPARE", here / "compare.json")
    assert compiler._baselines(out, dest)["rows"][1]["id"] == "optimum-o2-int8"


def test_report_bytes_depend_only_on_the_record(bundle):
    record = read_bundle(bundle)
    assert render(record, record["pareto"]) == render(record, record["pareto"])


def test_regression_errors_are_residuals():
    errors = error_breakdown([1.0, 2.5, 4.0], np.array([1.5, 2.5, 3.0], np.float32), [])
    assert errors["kind"] == "residuals" and errors["mae"] == pytest.approx(0.5) and sum(errors["histogram"]["counts"]) == 3
    # token tasks: the harness's tags of the labeled first pieces against the gold ones (-100 skipped)
    tags = error_breakdown([[1, 1], [0]], np.array([[-100, 0, 1], [0, -100, -100]]), LABELS)
    assert tags == {"kind": "confusion", "labels": LABELS, "matrix": [[1, 1], [0, 1]]}
    assert "MAE" in render({"bench_local": {"m.onnx": {"errors": errors}}}, [])


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (apt-get install chromium; "
                                                "CI installs it through .ci/setup-system)")
def test_report_renders_in_headless_chromium(bundle, tmp_path):
    page = (bundle / "report.html").resolve().as_uri()
    base = [_chromium(), *CHROMIUM_FLAGS]
    dom = subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile-dom'}", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    parsed = _Tables(dom)
    assert parsed.svgs == 2 and {"stages", "files", "pareto", "profile", "confusion", "machine", "versions"} <= \
        set(parsed.tables)
    assert _column(parsed.tables["stages"], "accuracy (points)")[:2] == ["81.54", "80.12"]
    shot = tmp_path / "report.png"
    subprocess.run([*base, f"--user-data-dir={tmp_path / 'profile-shot'}", "--hide-scrollbars",
                    "--window-size=1200,2400", f"--screenshot={shot}", page],
                   capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
