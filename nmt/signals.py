"""Ctrl-C (SIGINT) and SIGTERM held while something is started that must be owned before
either is handled: decoding's worker processes (`nmt.workers.pool`), a benchmark's peer
training (scripts/peers/common.py), the load test's server (scripts/load_test.py).

Why: Python runs a signal's handler in the main thread between two bytecodes, wherever that
thread is. Ctrl-C's KeyboardInterrupt can so be raised inside the call that starts the
processes, after they exist but before anything (a `with` block, a `try`) owns them: they
then outlive the interrupt, a pool's workers until garbage collection, a child process in a
session of its own until it ends by itself. Blocking the signals in the calling thread is not
enough: the kernel gives a process's signal to any thread that does not block it (torch's
OpenMP threads), whose Python handler then still raises in the main thread.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP = (signal.SIGINT, signal.SIGTERM)  # the signals that ask nmt to stop


@contextlib.contextmanager
def held(*, block: bool) -> Iterator[None]:
    """Inside the block, SIGINT's and SIGTERM's Python handlers are not run but recorded
    (main thread only: Python runs handlers nowhere else); on leaving, each recorded signal is
    raised again for its own handler. So a Ctrl-C that comes while the block starts
    processes and hands them to their owner is raised after, where the owner ends them.

    `block` also blocks both signals in this thread for the block: what it forks inherits the
    mask (`nmt.workers` unblocks it in each worker once the worker's own actions are set), so
    a forked process never runs this process's handlers. Not for a program started by exec
    (a peer's training): it would keep the mask, deaf to Ctrl-C."""
    caught: list[int] = []
    handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: h for s in STOP if callable(h := signal.getsignal(s))}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP) if block else None
    try:
        for s in handlers:
            signal.signal(s, lambda signum, _: caught.append(signum))
        yield
    finally:
        try:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            for s in caught:  # where blocked, pending until the mask is put back
                signal.raise_signal(s)
        finally:  # even where another thread's signal is raised here
            if previous is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
