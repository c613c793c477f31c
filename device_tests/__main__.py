"""`python -m device_tests run|verify|probe ...` on the device."""

import sys

from .cli import main

sys.exit(main())
