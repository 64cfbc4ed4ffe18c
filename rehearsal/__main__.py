"""`python -m rehearsal`: runs the command line of `rehearsal.cli`."""

import sys

from rehearsal.cli import main

sys.exit(main())
