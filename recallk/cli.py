"""The ``recallk`` console script: ``recallk compare A B`` (see ``recallk compare --help``), ``recallk datasets
prepare NAME ROOT`` (``recallk datasets --help``)."""

from __future__ import annotations

import sys
from typing import Sequence

COMMANDS = {"compare": "recallk.compare.cli", "datasets": "recallk.datasets.cli"}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        sys.stderr.write(f"usage: recallk {{{','.join(COMMANDS)}}} ...\n")
        return 2
    import importlib

    return importlib.import_module(COMMANDS[args[0]]).main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
