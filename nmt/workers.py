"""Decoding a file's batches in worker processes on a CPU (`nmt translate --workers N`,
`nmt eval --workers N`, `Translator.from_checkpoint(workers=N)`).

Why: a decoding step of an RNN model on a CPU is some fifty small operators, each a few
microseconds of dispatch and a few of arithmetic at 64 sentences, and spreading each one
over the cores' threads gains little. On 2 cores of a Xeon with AMX, greedy int8 decoding of
test_2016_flickr took 0.83 s with 2 threads, and 0.52 and 0.59 s in two processes of 1
thread each decoding half of the batches side by side. So N workers of cores/N threads each
take one batch at a time, as Marian's CPU decoder runs its `--cpu-threads` workers. Through
`scripts/compare_peers.py --decode-workers 2` (fresh processes, medians of five): greedy 1.01
→ 0.76 s, beam 5 3.40 → 3.06 (docs/benchmarks.md, session 26). Beam search gains less: its
products are 5× larger and use their threads well.

How: the workers are forked from the process that loaded the model, so they share its
weights (copy-on-write, never written) and start in milliseconds; each sets its own thread
count first, as PyTorch's forked DataLoader workers do. They
are started before anything else in the parent has a thread of its own (the progress bar's).
Batches go out one at a time, so a worker that finishes early takes the next, and results
come back in batch order. Tensors in a result travel by value as numpy arrays: pickled the
multiprocessing way, each would hold a shared-memory file open in the parent as long as it
lives, a thousand translations a thousand files. Ctrl-C is the parent's: workers ignore it,
and leaving the `pool` block ends them (by SIGTERM, to which they take the default action,
whatever handler the parent has: forked with both signals blocked, a worker never runs the
parent's handlers); a Ctrl-C while they are being forked is raised once the block owns them
(`nmt.signals.held`); a parent killed outright takes them with it (Linux), where they would
otherwise write into a closed pipe and print its traceback.

CPU only: CUDA does not survive a fork, and a GPU's kernels are not the bottleneck.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import multiprocessing
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from nmt import signals
from nmt.errors import NmtError

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# A worker's job, set in it by `_start` before its first task: inherited through the fork, it
# is never pickled (a closure over the parent's translator and sentences).
_job: Callable[[Any], Any] | None = None


def check_workers(workers: int, device: torch.device, flag: str = "--workers") -> None:
    """The one check of a worker count, for every way in (`flag`: the option that gave it)."""
    said = f"{flag} {workers}"
    if workers < 1:
        raise NmtError(f"{said}: expected at least 1")
    cores = os.cpu_count() or 1  # more processes than cores only share them (and memory)
    if workers > cores:
        raise NmtError(f"{said}: this machine has {cores} CPU cores; expected at most {cores}")
    if workers > 1 and device.type != "cpu":
        raise NmtError(f"{said}: worker processes decode on the CPU only")
    if workers > 1 and "fork" not in multiprocessing.get_all_start_methods():
        raise NmtError(f"{said}: this system cannot fork worker processes")


@contextlib.contextmanager
def pool(job: Callable[[Any], Any], workers: int) -> Iterator[Callable[[Iterable[Any]], Iterator]]:
    """A function that maps `job` over items, in order: in this process where `workers` is 1,
    else in `workers` forked processes of this process's threads / `workers` threads each.
    The processes start here and end when the block is left."""
    if workers == 1:
        yield lambda items: map(job, items)
        return
    threads = max(1, torch.get_num_threads() // workers)
    context = multiprocessing.get_context("fork")
    started = (job, threads, os.getpid())
    with contextlib.ExitStack() as owned:
        # forked with SIGINT and SIGTERM blocked (`_start` unblocks them), and the parent's
        # handlers held until leaving `owned` ends the workers, whatever comes
        with signals.held(block=True):
            processes = context.Pool(workers, initializer=_start, initargs=started)
            owned.enter_context(processes)
        yield lambda items: map(pickle.loads, processes.imap(_run, items))


def _start(job: Callable[[Any], Any], threads: int, parent: int) -> None:
    global _job
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C ends the parent, which ends the pool
    # Leaving the pool ends the workers by SIGTERM: never with a handler the parent installed
    # (one that exits at once, raising SystemExit in a worker blocked on the task queue's lock,
    # left it alive and the parent waiting for it forever)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP)  # blocked by `pool` for the fork
    if sys.platform.startswith("linux"):  # killed when the parent dies (prctl PR_SET_PDEATHSIG)
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that
        os._exit(0)
    torch.set_num_threads(threads)
    _job = job


def _run(item: Any) -> bytes:
    assert _job is not None, "a worker runs its job only after _start"
    return _by_value(_job(item))


def _by_value(result: Any) -> bytes:
    """`result` pickled with its CPU tensors as numpy arrays (`_ByValue`)."""
    buffer = io.BytesIO()
    _ByValue(buffer).dump(result)
    return buffer.getvalue()


class _ByValue(pickle.Pickler):
    """Pickles CPU tensors as numpy arrays (their bytes, read back without a copy by
    `torch.from_numpy`); the rest as pickle does."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and obj.dtype in _NUMPY:
            return torch.from_numpy, (obj.detach().numpy(),)
        return NotImplemented


# The tensor dtypes numpy holds (bf16 is not one of them; such tensors pickle as torch does).
_NUMPY = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.bool}
