"""`python -m edgebert VERB ...`, and so `torchrun ... -m edgebert compile ...`: the command line (edgebert.cli)."""

import sys

from .cli import main

sys.exit(main())
