"""`python -m tools.rehearsal`: runs the command line of `tools.rehearsal.cli`."""

import sys

from tools.rehearsal.cli import main

sys.exit(main())
