"""``python -m recallk.compare A B``: see :mod:`recallk.compare.cli`."""

import sys

from recallk.cli import show_progress_lines
from recallk.compare.cli import main

show_progress_lines()
sys.exit(main())
