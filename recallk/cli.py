"""The ``recallk`` console script: ``recallk compare A B`` (see ``recallk compare --help``), ``recallk
leaderboard|track|report A B C ...``, ``recallk datasets prepare NAME ROOT`` (``recallk datasets --help``)."""

from __future__ import annotations

import logging
import sys
from typing import Sequence

COMMANDS = {"compare": "recallk.compare.cli", "datasets": "recallk.datasets.cli"}
#: ``recallk leaderboard``, ``recallk track`` and ``recallk report`` (issue 24): module and entry point.
COMMANDS.update(leaderboard="recallk.compare.board_cli", track="recallk.compare.board_cli:track_main",
                report="recallk.compare.multi_report:main")


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record comes (not the stream of the moment
    it was made: a test's captured stream, since closed)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def show_progress_lines() -> None:
    """Send the ``recallk`` loggers' INFO records to stderr as ``INFO <logger>: <message>`` (the stages' format,
    stages/runner.py): the periodic lines of :class:`recallk.progress.Progress` when stderr is no terminal (a CI
    job, a log), which Python's default handling (warnings only) would drop. Once, however often called; for the
    console commands only: a library user configures logging as they like."""
    logger = logging.getLogger("recallk")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        sys.stderr.write(f"usage: recallk {{{','.join(COMMANDS)}}} ...\n")
        return 2
    import importlib

    show_progress_lines()  # progress of a long compare or leaderboard in a log or CI job, not only on a terminal
    module, _, function = COMMANDS[args[0]].partition(":")
    try:
        return getattr(importlib.import_module(module), function or "main")(args[1:])
    except KeyboardInterrupt:  # Ctrl-C: every file the commands write is written whole or not at all
        sys.stderr.write(f"error: interrupted (Ctrl-C) before `recallk {args[0]}` finished; no file it writes was "
                         "left half-written (each is written whole or not at all).\n")
        return 130  # as a shell reports a process ended by SIGINT


if __name__ == "__main__":
    sys.exit(main())
