"""Trainings that take turns on the CPU (`compare_peers.py --interleave SECONDS`), and their
speed read from the log windows that lie wholly inside one of their turns.

Why (docs/benchmarks.md, sessions 46 and 48): a shared CPU has slow spells that last
minutes, and one after the other the toolkits train for 4-10 minutes each. So a run's ratio
compares trainings that met different spells: on the Zen 4, over nineteen runs, nmt's and
OpenNMT-py's tokens/s moved together with a correlation of only 0.03-0.38, and the ratio
moved more than either. Here every training is started at once but only one runs at a time.
Each runs for SECONDS while the others are stopped (SIGSTOP to its process group; SIGCONT when
its turn comes back), so within a cycle of turns every training meets the same spell. A time
budget (`--minutes`) counts a training's own running seconds, not the clock's.

A toolkit logs tokens/s per window of updates, by the clock: a window that spans a stop
counts the stopped seconds too. So each window is read with the time its log line was
written (the peers' log lines carry the clock's time to the millisecond; nmt's metrics rows
their `time`) and kept only if it began and ended inside one turn, after the turn's first
such window: the process warms up again after each stop (see `inside`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers.spread import correlation, variation

# A peer's log line begins with the clock's time: OpenNMT-py "[2026-11-27 14:59:47,473 INFO]",
# Joey NMT "2026-11-28 10:25:19,004 - INFO - ..." (the local time, as this process reads it)
STAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\b")


@dataclass
class _Training:
    pid: int  # its process group
    turns: list[list[float]] = field(default_factory=list)  # [start, end] by time.time()
    ran: float = 0.0  # running seconds of its finished turns
    interrupted: float = 0.0  # time.time() when its budget ended (0: it has not)


class Turns:
    """The trainings under way, one running at a time for `seconds` each, in the order they
    joined. Every method takes the lock: each training is waited for by its own thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._all: dict[Path, _Training] = {}  # every training that joined, by its log
        self._order: list[Path] = []  # those still running, in turn order
        self._current: Path | None = None
        self._since = 0.0  # time.monotonic() when the current turn began

    def join(self, log: Path, pid: int) -> None:
        """`pid` (a process group just started, writing `log`) into the rotation: stopped
        at once unless no other training is under way."""
        with self._lock:
            self._all[log] = _Training(pid)
            self._order.append(log)
            if self._current is None:
                self._begin(log)
            else:
                _signal(pid, signal.SIGSTOP)

    def leave(self, log: Path) -> None:
        """`log`'s training has ended: out of the rotation, and the next one's turn if it
        was running."""
        with self._lock:
            at = self._order.index(log)
            self._order.remove(log)
            if self._current == log:
                self._end(stop=False)  # its group is gone
                if self._order:
                    self._begin(self._order[at % len(self._order)])

    def tick(self) -> None:
        """The next training's turn, if the current one has had its seconds (one alone runs
        on: its turn is not cut)."""
        with self._lock:
            if self._current is None or len(self._order) < 2:
                return
            if time.monotonic() - self._since < self.seconds:
                return
            at = self._order.index(self._current)
            self._end(stop=True)
            self._begin(self._order[(at + 1) % len(self._order)])

    def running(self, log: Path) -> float:
        """The seconds `log`'s training has run so far (its turns', the current one's too)."""
        with self._lock:
            t = self._all[log]
            return t.ran + (time.monotonic() - self._since if self._current == log else 0.0)

    def interrupt(self, log: Path) -> None:
        """Records that `log`'s budget ended now (the caller sends the signal)."""
        with self._lock:
            self._all[log].interrupted = time.time()

    def turns_of(self, log: Path) -> list[tuple[float, float]]:
        """`log`'s turns, (start, end) by time.time(); one under way ends now."""
        with self._lock:
            now = time.time()
            return [(a, b or now) for a, b in self._all[log].turns]

    def interrupted_at(self, log: Path) -> float:
        with self._lock:
            return self._all[log].interrupted

    def stop_all(self) -> None:
        """Every training still in the rotation killed (this script is ending early)."""
        with self._lock:
            for log in self._order:
                _signal(self._all[log].pid, signal.SIGKILL)  # stopped or not

    def _begin(self, log: Path) -> None:
        self._current = log
        self._since = time.monotonic()
        self._all[log].turns.append([time.time(), 0.0])
        _signal(self._all[log].pid, signal.SIGCONT)

    def _end(self, *, stop: bool) -> None:
        assert self._current is not None
        t = self._all[self._current]
        if stop:
            _signal(t.pid, signal.SIGSTOP)
        t.turns[-1][1] = time.time()
        t.ran += time.monotonic() - self._since
        self._current = None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # its group has just ended
        os.killpg(pid, sig)


@contextlib.contextmanager
def taking_turns(seconds: float) -> Iterator[Turns]:
    """A rotation whose trainings are all killed if the block ends with an error."""
    turns = Turns(seconds)
    try:
        yield turns
    except BaseException:
        turns.stop_all()
        raise


def together(jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    """Each job run in its own thread, all at once; their results in order. A job's error
    is raised as soon as it comes, the others' threads left to end with their trainings,
    which the caller kills (`taking_turns`): a failed row fails the run, and the others
    would only train on for nothing."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as e:  # SystemExit too: a failed training's message
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        # in short waits: a signal the kernel gives another thread (SIGTERM, Ctrl-C) has its
        # Python handler run by this one only between two waits, never inside an endless one
        while t.is_alive() and not errors:
            t.join(0.2)
        if errors:
            raise errors[0]
    return results


def stamp(line: str) -> float | None:
    """The clock time a peer's log line was written (None: the line carries none)."""
    m = STAMP.match(line)
    if m is None:
        return None
    when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
    return when.timestamp() + int(m.group(2)) / 1000


def inside(times: Sequence[float | None], turns: Sequence[Sequence[float]]) -> list[int]:
    """For each log window (ended at times[i], begun at times[i - 1]), the index of the turn
    that holds it wholly, or -1: the first window (its start is the process's), those that
    span a stop or carry no time, and each turn's first window inside it. That one runs warm
    again after the stop: in session 49's run (turns of 20 s, a window every 5 updates) it
    was 10 % slower than the turn's later windows for OpenNMT-py and 5 % for nmt bf16."""
    found = []
    seen: set[int] = set()  # the turns whose first window inside has gone by
    for i, end in enumerate(times):
        start = times[i - 1] if i else None
        where = -1
        if start and end:  # a window without a time (0.0 in a run's file) is not placed
            for k, (a, b) in enumerate(turns):
                if a <= start and end <= b:
                    where = k if k in seen else -1
                    seen.add(k)
                    break
        found.append(where)
    return found


def speed(windows: Sequence[float], times: Sequence[float | None], where: Sequence[int]) -> float:
    """The tokens/s of the windows inside a turn (`inside`), taken together: their tokens
    (each window's tokens/s times its seconds) over their seconds; 0.0 where none was. Not
    their median, as one after the other: a window every 5 updates (so that a turn of 20 s
    holds several) varies more than one every 25, and its median ran 1.3-2.4 % above the
    windows' own rate in session 49's runs."""
    tokens = seconds = 0.0
    for i, k in enumerate(where):
        if k >= 0:
            took = times[i] - times[i - 1]  # type: ignore[operator]  # placed: both are times
            tokens += windows[i] * took
            seconds += took
    return tokens / seconds if seconds > 0 else 0.0


def per_turn(
    windows: Sequence[float], times: Sequence[float | None], where: Sequence[int]
) -> dict[int, float]:
    """Each turn's tokens/s (`speed` of the windows inside it; turns without one left out)."""
    turns = {k for k in where if k >= 0}
    return {k: speed(windows, times, [w if w == k else -1 for w in where]) for k in sorted(turns)}


def same_spells(name: str, base: dict[float, float], row: dict[float, float]) -> str:
    """How `name`'s tokens/s moved against the baseline's over the cycles of turns: each of
    its turns (its middle's time -> its tokens/s, `per_turn`) paired with the baseline's
    nearest in time, each of those used once. Each one's spread (standard deviation over
    mean), their ratio's, and the correlation of the two. Where both met the same spells,
    the ratio moves less than either."""
    pairs: dict[float, tuple[float, float]] = {}  # the baseline's turn -> the two rates
    for when, rate in sorted(row.items()):
        nearest = min(base, key=lambda t: abs(t - when), default=None)
        if nearest is not None and nearest not in pairs:
            pairs[nearest] = (base[nearest], rate)
    if len(pairs) < 3:
        return f"{name}: {len(pairs)} turn(s) paired with the baseline's; 3 are needed"
    a, b = [x for x, _ in pairs.values()], [y for _, y in pairs.values()]
    ratios = [y / x for x, y in pairs.values()]
    r = correlation(a, b)
    return (
        f"{name} over {len(pairs)} cycles of turns: tokens/s spread {variation(b):.1%} "
        f"(the baseline's {variation(a):.1%}), their ratio's {variation(ratios):.1%}, r "
        + ("-" if r is None else f"{r:.2f}")
    )
