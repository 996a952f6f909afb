"""recallk.progress: periodic log lines when stderr is not a terminal (under ``dvc repro``)."""

from __future__ import annotations

import logging

from recallk.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_logs_a_line_per_interval_with_rate_and_time_left(caplog):
    clock = Clock()
    log = logging.getLogger("test.progress")
    with caplog.at_level(logging.INFO, logger="test.progress"):
        with Progress(100, "encode pixels", "img", log, interval=10.0, clock=clock) as bar:
            assert bar.bar.disable  # pytest captures stderr: not a terminal, so no bar
            clock.now = 105.0
            bar.update(10)  # before the first interval: silent
            clock.now = 110.0
            bar.update(10)  # 20 done in 10 s: 2 img/s, 80 left: 40 s
            clock.now = 115.0
            bar.update(10)  # within the next interval: silent
            clock.now = 150.0
            bar.update(70)  # finished: no line
    assert [r.getMessage() for r in caplog.records] == [
        "encode pixels: 20/100 img (20%), 2.0 img/s, about 40 s left"]


def test_zero_total_and_no_progress_say_so():
    clock = Clock()
    bar = Progress(0, "hash+decode", "img", logging.getLogger("test.progress"), clock=clock)
    assert bar.line(clock.now) == "hash+decode: 0/0 img (100%), 0.0 img/s, time left unknown"
    bar.__exit__(None, None, None)
