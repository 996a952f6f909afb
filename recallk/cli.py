"""The ``recallk`` console script: ``recallk compare A B`` (see ``recallk compare --help``), ``recallk
leaderboard|track|report A B C ...``, ``recallk datasets prepare NAME ROOT`` (``recallk datasets --help``)."""

from __future__ import annotations

import sys
from typing import Sequence

COMMANDS = {"compare": "recallk.compare.cli", "datasets": "recallk.datasets.cli"}
#: ``recallk leaderboard``, ``recallk track`` and ``recallk report`` (issue 24): module and entry point.
COMMANDS.update(leaderboard="recallk.compare.board_cli", track="recallk.compare.board_cli:track_main",
                report="recallk.compare.multi_report:main")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        sys.stderr.write(f"usage: recallk {{{','.join(COMMANDS)}}} ...\n")
        return 2
    import importlib

    from recallk.progress import show_progress_lines

    show_progress_lines()  # progress of a long compare or leaderboard in a log or CI job, not only on a terminal
    module, _, function = COMMANDS[args[0]].partition(":")
    return getattr(importlib.import_module(module), function or "main")(args[1:])


if __name__ == "__main__":
    sys.exit(main())
