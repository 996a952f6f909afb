"""``python -m recallk.compare A B``: see :mod:`recallk.compare.cli`."""

import sys

from recallk.compare.cli import main

sys.exit(main())
