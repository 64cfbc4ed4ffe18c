"""`python -m pipelines.rehearse`: runs the command line of `pipelines.rehearse.cli`."""

import sys

from pipelines.rehearse.cli import main

sys.exit(main())
