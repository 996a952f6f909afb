"""``python -m recallk.compare A B``: see :mod:`recallk.compare.cli` (run as ``recallk compare``, so Ctrl-C is
one line too)."""

import sys

from recallk.cli import main

sys.exit(main(["compare", *sys.argv[1:]]))
