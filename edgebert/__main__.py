"""`python -m edgebert VERB ...`, and so `torchrun ... -m edgebert compile ...`: the command line (edgebert.cli)."""

import sys

from .cli import main

if __name__ == "__main__":  # importing the module (tests that walk every module) runs nothing
    sys.exit(main())
