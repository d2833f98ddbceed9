"""Decoding in worker processes (nmt.workers): the same translations as one process with the
workers' thread count, in input order, for every search and what a translation carries
(n-best, attention, copy shares, heads); results that hold no file open in the parent; a
worker's error raised in the caller; bad worker counts refused in one line."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from children import run_alone
from test_cli import runner

from nmt import workers
from nmt.cli import app
from nmt.errors import NmtError
from nmt.translate import Translation, Translator


@pytest.fixture
def threads() -> Iterator[int]:
    """Two threads for the test (one per worker), the process's count put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield 2
    torch.set_num_threads(before)


def _alike(got: list[Translation], want: list[Translation]) -> None:
    assert [t.text for t in got] == [t.text for t in want]
    for g, w in zip(got, want, strict=True):
        assert g.source == w.source and g.nbest == w.nbest and g.score == w.score
        assert g.tokens == w.tokens and g.finished == w.finished
        assert torch.equal(g.attention, w.attention)
        assert g.copied == w.copied
        assert (g.heads is None) == (w.heads is None)
        if g.heads is not None and w.heads is not None:
            assert torch.equal(g.heads, w.heads)


@pytest.mark.parametrize("beam, nbest", [(1, 1), (3, 2)])
@pytest.mark.parametrize("run", ["tiny_run", "tiny_heads_run"])
def test_workers_translate_as_one_process_with_their_threads(run, beam, nbest, request, threads):
    tiny = request.getfixturevalue(run)
    sentences = [*tiny.train_src, "", tiny.train_src[0]]  # an empty input keeps its place
    two = Translator.from_checkpoint(tiny.run_dir, workers=2)
    got = two.translate(sentences, beam=beam, nbest=nbest, batch_size=5, with_heads=True)
    one = Translator.from_checkpoint(tiny.run_dir)
    torch.set_num_threads(threads // 2)  # what each worker ran with
    want = one.translate(sentences, beam=beam, nbest=nbest, batch_size=5, with_heads=True)
    _alike(got, want)
    assert got[-2].text == "" and got[-1].text == got[0].text


def test_results_hold_no_file_open_in_the_caller(tiny_run, threads):
    """Pickled as multiprocessing pickles tensors, each translation's attention would keep a
    shared-memory file open for as long as it lives."""
    sentences = tiny_run.train_src * 4
    tr = Translator.from_checkpoint(tiny_run.run_dir, workers=2)
    tr.translate(sentences[:4], batch_size=2)  # anything opened once for good
    before = len(os.listdir("/proc/self/fd"))
    out = tr.translate(sentences, batch_size=2)
    assert len(out) == len(sentences) and all(t.attention.numel() for t in out)
    assert len(os.listdir("/proc/self/fd")) <= before + 2


def test_tensors_travel_by_value():
    t = torch.arange(12, dtype=torch.float32).view(3, 4)[:, 1:]  # not contiguous
    back = pickle.loads(workers._by_value(t))
    assert torch.equal(back, t) and back.dtype == torch.float32


def _fails(item: int) -> int:
    raise ValueError(f"item {item}")


def test_a_workers_error_is_raised_in_the_caller():
    with workers.pool(_fails, 2) as mapped, pytest.raises(ValueError, match="item 0"):
        list(mapped([0, 1]))


def _sigterm(item: int) -> bool:
    return signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_workers_end_by_sigterm_whatever_handler_the_parent_has():
    """Leaving the pool ends its workers by SIGTERM; a worker that inherited the parent's
    handler (a script's, which exits: compare_peers.main's, left in the suite's process by a
    test) hung at its exit once, and the parent with it."""
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    try:
        with workers.pool(_sigterm, 2) as mapped:
            assert list(mapped([0, 1])) == [True, True]
    finally:
        signal.signal(signal.SIGTERM, before)


# A program whose SIGTERM handler exits (as compare_peers.main's does), whose workers are still
# starting (before `_start`) when it leaves the pool: the pool ends them by SIGTERM then.
_SLOW_START = """
import os, signal, sys, time
from nmt import workers
parent = os.getpid()
def exits(*_):
    if os.getpid() != parent:
        os.write(2, b"the parent's handler ran in a worker\\n")
    sys.exit("terminated")
signal.signal(signal.SIGTERM, exits)
start = workers._start
def slow_start(*args):
    time.sleep(1)
    start(*args)
workers._start = slow_start
with workers.pool(abs, 2):
    pass
"""


def test_a_worker_still_starting_ends_by_sigterm_not_by_the_parents_handler():
    """The window before `_start` (a worker forked with the parent's handler that had not yet
    set its own): the suite hung there in CI, the parent joining a worker that ran the handler."""
    ran = run_alone([_SLOW_START], hung="leaving the pool hung on a worker that was still starting")
    assert ran.returncode == 0 and ran.stderr == ""


# A program interrupted (SIGINT, as Ctrl-C) while its pool is forking its workers, whose
# exception it keeps (so its frames, and any pool they hold, stay alive: no garbage collection
# ends the workers): it prints how many of its workers are still running. With `thread`, a
# thread of its own that does not block the signal takes it (the kernel gives a process's
# signal to any thread that does not block it: torch's OpenMP threads, say), so Python raises
# it in the middle of the fork; without, it waits, blocked, for the pool's call to unblock it.
_INTERRUPTED_FORK = """
import multiprocessing, multiprocessing.pool, os, signal, sys, threading, time
from nmt import workers
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
repopulate = multiprocessing.pool.Pool._repopulate_pool
def interrupted(self):
    repopulate(self)  # the workers forked
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # a thread that took it has run Python's handler by now
multiprocessing.pool.Pool._repopulate_pool = interrupted
try:
    with workers.pool(abs, 2):
        sys.exit("the pool's block ran")
except KeyboardInterrupt as e:
    kept = e
    print(len(multiprocessing.active_children()))
"""


@pytest.mark.parametrize("thread", ["thread", "no thread"])
def test_ctrl_c_while_the_pool_forks_ends_its_workers(thread):
    """Ctrl-C during the pool's fork is raised only once the pool is in hand, so leaving ends
    the workers as it does after: before, the pool (or its half-built workers) outlived the
    interrupt until garbage collection."""
    ran = run_alone([_INTERRUPTED_FORK, thread], hung="the interrupted pool hung")
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "0\n", "")


@pytest.mark.parametrize(
    "n, device, message",
    [(0, "cpu", "at least 1"), (2, "cuda", "CPU"), ((os.cpu_count() or 1) + 1, "cpu", "at most")],
)
def test_bad_worker_counts_are_refused(n, device, message):
    with pytest.raises(NmtError, match=f"--workers {n}: .*{message}"):
        workers.check_workers(n, torch.device(device))


def test_translate_and_eval_take_workers(tiny_run, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(tiny_run.train_src) + "\n", encoding="utf-8")
    base = ["translate", "--input", str(src), "--model", str(tiny_run.run_dir), "--device", "cpu"]
    one = runner.invoke(app, [*base, "--batch-size", "4"])
    two = runner.invoke(app, [*base, "--batch-size", "4", "--workers", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, two.output
    assert two.stdout.splitlines() and len(two.stdout.splitlines()) == len(tiny_run.train_src)
    bad = runner.invoke(app, [*base, "--workers", "0"])
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --workers 0: expected at least 1"
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(tiny_run.train_tgt) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.txt"
    args = ["eval", "--src", str(src), "--ref", str(ref), "--model", str(tiny_run.run_dir)]
    scored = runner.invoke(app, [*args, "--workers", "2", "-o", str(hyp), "--device", "cpu"])
    assert scored.exit_code == 0, scored.output
    assert "BLEU" in scored.stdout and len(hyp.read_text().splitlines()) == len(tiny_run.train_src)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the workers")
def test_a_terminated_caller_takes_its_workers_with_it_quietly(tiny_run):
    """SIGTERM ends `nmt translate` as without workers (143, nothing on stderr); its workers
    end with it instead of printing a broken pipe's traceback."""
    code = (
        "import sys\nfrom nmt.translate import Translator\n"
        f"tr = Translator.from_checkpoint({str(tiny_run.run_dir)!r}, workers=2)\n"
        f"tr.translate({tiny_run.train_src!r} * 200, batch_size=2)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if children.exists() and len(children.read_text().split()) == 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, (
        f"the caller ended before its workers started: {proc.communicate()[1]!r}"
    )
    pids = children.read_text().split()
    assert len(pids) == 2, f"the caller's children after 60 s: {pids}"
    time.sleep(0.5)  # the workers at work
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM and err == ""
    time.sleep(0.5)
    assert not [p for p in pids if _running(p)]


def _running(pid: str) -> bool:
    """Whether process `pid` is alive (a zombie waiting for whoever adopted it is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
