"""``python -m dslide_workflows``: the ``dslide`` command line."""

import sys

from dslide_workflows.cli import main

sys.exit(main())
