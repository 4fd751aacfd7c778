"""``python -m ring``: the same as the ``ring`` command."""

import sys

from ring.cli import main

sys.exit(main())
