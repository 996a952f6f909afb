"""``python -m recallk.compare A B``: see :mod:`recallk.compare.cli`."""

import sys

from recallk.compare.cli import main
from recallk.progress import show_progress_lines

show_progress_lines()
sys.exit(main())
