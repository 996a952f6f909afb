"""Progress of long loops: a tqdm bar on a terminal, periodic log lines otherwise.

Under ``dvc repro`` stderr is not a terminal, so tqdm (``disable=None``) hides its bar;
:class:`Progress` then logs a line every ``interval`` seconds with the count, the rate
and the time left, so a long encode is never silent.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from tqdm import tqdm


class Progress:
    """Count ``total`` items of work: ``with Progress(total, "encode", "img", log) as bar: bar.update(n)``."""

    def __init__(self, total: int, desc: str, unit: str, log: logging.Logger, interval: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, delay: float = 0.0) -> None:
        """``interval``: seconds between log lines (the first one after ``interval``); ``delay``: seconds
        before the terminal bar appears (none for a loop that ends sooner)."""
        self.total, self.desc, self.unit, self.log, self.interval, self.clock = total, desc, unit, log, interval, clock
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=None, delay=delay)
        self.done, self.start = 0, clock()
        self.next_line = self.start + interval

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        now = self.clock()
        if self.bar.disable and now >= self.next_line and self.done < self.total:
            self.log.info("%s", self.line(now))
            self.next_line = now + self.interval

    def line(self, now: float) -> str:
        """``"<desc>: done/total unit (pct%), rate unit/s, about N s left"`` (or ``time left unknown``)."""
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        left = f"about {(self.total - self.done) / rate:.0f} s left" if rate > 0 else "time left unknown"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.desc}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {rate:.1f} {self.unit}/s, {left}"

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()
