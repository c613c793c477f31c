"""Real check of the compression passes on SST-2, from the MiniLM-L6 teacher.

(a) a distilled 4-layer student; (b) (a) with 50% of heads and FFN neurons pruned; (c) (b) with
ALBERT sharing in groups of 2 and factorized embeddings E=128. Each stage is resumable: re-run
the same command after a kill and it continues. Results go to bench/results/passes.json.

    python bench/passes.py --out runs/passes [--stages a,b,c] [--steps-a 2400 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from edgebert import checkpoint
from edgebert.data import EncodedDataset, TaskData, load_task
from edgebert.device_tests.files import write_json
from edgebert.passes import (
    DistillConfig,
    PruneConfig,
    ShareConfig,
    TrainConfig,
    distill,
    evaluate,
    measure,
    prune,
    share,
)
from edgebert.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEACHER = ROOT.parent / "shared" / "models" / "minilm-l6-sst2"


def recovery(steps: int, args, eval_every: int, *, freeze: bool = True, **student) -> DistillConfig:
    """Logit + hidden-state distillation, batch 32, length buckets; the V×H word table frozen.
    `student` (e.g. layers=4) makes distill build the student from the model it is given."""
    return DistillConfig(
        train=TrainConfig(steps=steps, batch_size=32, lr=args.lr, warmup=0.06, eval_every=eval_every,
                          save_every=100, freeze_word_embeddings=freeze, seed=args.seed),
        temperature=args.temperature, logit_weight=1.0, hidden_weight=args.hidden_weight,
        cache_dir=args.cache or str(Path(args.out) / "teacher-cache"), **student)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default=str(TEACHER))
    parser.add_argument("--out", default=str(ROOT / "runs" / "passes"))
    parser.add_argument("--cache", help="teacher-output cache folder (default: <out>/teacher-cache)")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results" / "passes.json"))
    parser.add_argument("--stages", default="a,b,c")
    parser.add_argument("--steps-a", type=int, default=2400)
    parser.add_argument("--steps-b", type=int, default=700, help="recovery steps per pruning round")
    parser.add_argument("--rounds-b", type=int, default=2)
    parser.add_argument("--steps-c", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--hidden-weight", type=float, default=1.0)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    results_file = Path(args.results)
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results["command"] = "python " + " ".join(sys.argv)
    results["threads"] = args.threads

    def record(name: str, model, wall_s: float, extra: dict | None = None) -> None:
        rec = measure(name, model, metrics=evaluate(model, dev), wall_s=wall_s).to_dict()
        rec["details"] = extra or {}
        results[name] = rec
        results_file.parent.mkdir(parents=True, exist_ok=True)
        write_json(results_file, results)
        print(f"{name}: accuracy {rec['metrics']['accuracy']:.4f} params {rec['params']:,} bytes {rec['bytes']:,} "
              f"flops@128 {rec['flops_128']:,} wall {wall_s:.0f}s", flush=True)

    tokenizer = load_tokenizer(args.teacher)
    train_data = EncodedDataset(load_task("sst2", "train"), tokenizer, args.max_length)
    dev = EncodedDataset(load_task("sst2", "dev"), tokenizer, args.max_length)
    data = TaskData(train_data, dev, tokenizer)
    teacher = checkpoint.load(args.teacher)
    if "teacher" not in results:
        record("teacher", teacher, 0.0)

    def stage(name: str, run):
        """Run a stage once; a finished stage is reloaded from <out>/<name>/model."""
        folder = out / name
        if not (folder / "model" / "config.json").exists():
            t0 = time.time()
            result = run(folder)
            model, rec = result.model, result.record
            checkpoint.save(model, folder / "model", tokenizer_from=args.teacher)
            rec.details.update(command=results["command"], stage_wall_s=round(time.time() - t0, 1))
            write_json(folder / "record.json", rec.to_dict())
        model = checkpoint.load(folder / "model")
        if name not in results:
            rec = json.loads((folder / "record.json").read_text())
            record(name, model, rec["wall_s"], rec["details"])
        return model

    stages = args.stages.split(",")

    def run_a(folder):
        return distill(teacher, recovery(args.steps_a, args, 400, layers=4), data, work_dir=folder)

    a = stage("a_distilled_4l", run_a)

    def run_b(folder):
        config = PruneConfig(heads=0.5, ffn=0.5, per_layer=True, rounds=args.rounds_b,
                             recovery=recovery(args.steps_b, args, 350))
        return prune(a, config, data, teacher=teacher, work_dir=folder)

    b = stage("b_pruned_50", run_b) if "b" in stages or "c" in stages else None

    def run_c(folder):
        config = ShareConfig(group_size=2, parts="all", init="best", embedding_size=128,
                             recovery=recovery(args.steps_c, args, 250, freeze=False))  # V×128 is small: train it
        return share(b, config, data, teacher=teacher, work_dir=folder)

    if "c" in stages:
        stage("c_shared_factorized", run_c)


if __name__ == "__main__":
    main()
