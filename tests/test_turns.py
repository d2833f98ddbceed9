"""compare_peers.py --interleave (`scripts/peers/turns.py`): trainings that take turns on the
CPU, stopped and resumed, their budgets in running seconds, and their speed read from the
log windows that lie inside one turn."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import run_alone
from train_setup import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import compare_peers  # noqa: E402
from peers import common, nmt_toolkit, previous, turns  # noqa: E402
from peers.turns import Turns, inside, per_turn, same_spells, speed, stamp, together  # noqa: E402

# A program that writes the clock's time to argv[1] every 20 ms, until interrupted.
TICKER = """
import sys, time
with open(sys.argv[1], "a") as f:
    while True:
        f.write(f"{time.time()}\\n")
        f.flush()
        time.sleep(0.02)
"""


def test_a_window_counts_only_inside_one_turn_after_its_first_there():
    ts = [(100.0, 110.0), (120.0, 130.0)]
    # windows ending at 101 (the first: its start is the process's), 103 (the first turn's
    # first inside it: warming up again), 106 and 109 (inside it), 112 (spans the stop), 125
    # (begun at 112, in the stop), 127 (the second turn's first inside), 128 (inside), None
    # (no time) and 129 (begun at an unknown time)
    times = [101.0, 103.0, 106.0, 109.0, 112.0, 125.0, 127.0, 128.0, None, 129.0]
    where = inside(times, ts)
    assert where == [-1, -1, 0, 0, -1, -1, -1, 1, -1, -1]
    windows = [1.0, 2.0, 10.0, 20.0, 2.0, 3.0, 4.0, 40.0, 5.0, 6.0]
    # their tokens over their seconds: (10 x 3 + 20 x 3 + 40 x 1) / 7
    assert speed(windows, times, where) == pytest.approx(130 / 7)
    assert per_turn(windows, times, where) == {0: pytest.approx(15.0), 1: pytest.approx(40.0)}
    assert speed([1.0], [5.0], [-1]) == 0.0  # no window inside a turn: no speed
    assert inside([0.0, 105.0, 106.0], ts) == [-1, -1, -1]  # 0.0: a window without a time


def test_peer_log_lines_give_their_clock_time():
    onmt = "[2026-11-27 14:59:47,473 INFO] Step 25/ 1000; acc: 7.7; 479/603 tok/s;     47 sec;"
    joey = "2026-11-28 10:25:19,004 - INFO - joeynmt.training - Epoch   1, Step:       25, ..."
    when = time.mktime(time.strptime("2026-11-27 14:59:47", "%Y-%m-%d %H:%M:%S"))
    assert stamp(onmt) == pytest.approx(when + 0.473)
    assert stamp(joey) is not None and stamp(joey) % 1 == pytest.approx(0.004, abs=1e-6)
    assert stamp("epoch 1 step 25: lr=0.001 loss=7.2") is None


def test_same_spells_pairs_each_turn_with_the_baselines_nearest():
    base = {0.0: 100.0, 10.0: 50.0, 20.0: 100.0, 30.0: 80.0}
    moved = {1.0: 200.0, 11.0: 100.0, 19.0: 200.0, 33.0: 160.0}
    line = same_spells("nmt", base, moved)
    assert line.startswith("nmt over 4 cycles of turns:")
    assert "their ratio's 0.0%" in line and line.endswith("r 1.00")
    # a baseline turn is paired once: 29 and 31 both lie nearest to 30
    assert "2 turn(s) paired" in same_spells("nmt", base, {29.0: 1.0, 31.0: 2.0, 2.0: 3.0})
    assert "0 turn(s) paired" in same_spells("nmt", {}, moved)
    flat = same_spells("nmt", {0.0: 1.0, 10.0: 1.0, 20.0: 1.0}, {0.0: 1.0, 10.0: 2.0, 20.0: 3.0})
    assert flat.endswith("r -")  # the baseline did not move: no correlation to give


def _ticking(tmp_path: Path, name: str, rotation: Turns, minutes: float) -> Path:
    out = tmp_path / f"{name}.times"
    cmd = [sys.executable, "-c", TICKER, str(out)]
    common.run(cmd, log=tmp_path / f"{name}.log", minutes=minutes, turns=rotation)
    return out


def test_trainings_take_turns_and_their_budgets_are_their_running_seconds(tmp_path):
    """Two programs started at once, in turns of 0.4 s: neither writes while the other's turn
    runs, each runs for its own budget (0.02 minutes, 1.2 s) of turns, and the two together
    take about twice that by the clock."""
    rotation = Turns(0.4)
    start = time.time()
    a, b = together([lambda n=n: _ticking(tmp_path, n, rotation, 0.02) for n in "ab"])
    took = time.time() - start
    logs = {n: tmp_path / f"{n}.log" for n in "ab"}
    spans = {n: rotation.turns_of(logs[n]) for n in "ab"}
    for mine, theirs, out in (("a", "b", a), ("b", "a", b)):
        ran = sum(end - begin for begin, end in spans[mine])
        assert 1.2 <= ran <= 2.5, spans[mine]  # its budget, then its SIGINT handled
        assert rotation.interrupted_at(logs[mine]) > 0
        written = [float(x) for x in out.read_text().split()]
        assert len(written) > 20
        slack = 0.05  # a write just before a stop, stamped before it
        for t in written:
            assert not any(s + slack < t < e - slack for s, e in spans[theirs]), (t, spans)
    assert len(spans["a"]) >= 2 and len(spans["b"]) >= 2  # each stopped and resumed
    assert took >= 2.4


def test_a_failed_training_in_turns_fails_the_run_at_once_and_the_others_are_killed(tmp_path):
    """One of two trainings taking turns fails: its message is raised as soon as it ends,
    not after the other's minute, and the other's process is killed with the rotation."""
    start = time.monotonic()
    with pytest.raises(SystemExit, match=r"failed \(3\)"), turns.taking_turns(0.2) as rotation:
        together(
            [
                lambda: _ticking(tmp_path, "ok", rotation, 1.0),
                lambda: common.run(
                    [sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"],
                    log=tmp_path / "x",
                    turns=rotation,
                ),
            ]
        )
    assert time.monotonic() - start < 30
    ticks = tmp_path / "ok.times"
    time.sleep(1.0)
    written = ticks.read_text()
    time.sleep(0.5)
    assert ticks.read_text() == written  # killed: it writes no more


def test_taking_turns_kills_every_training_when_the_block_fails(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", TICKER, str(tmp_path / "t")], start_new_session=True
    )
    try:
        with pytest.raises(RuntimeError), turns.taking_turns(0.5) as rotation:
            rotation.join(tmp_path / "log", proc.pid)
            raise RuntimeError("an error while the trainings ran")
        assert proc.wait(timeout=10) < 0  # killed, though it may have been stopped
    finally:
        proc.kill()


def test_nmt_rows_take_turns_and_read_their_speed_inside_them(tmp_path):
    """Two tiny nmt trainings in turns of 1 s (the clock's time on each metrics row): each
    row keeps its turns and its windows' times, and its tokens/s is that of the windows
    that lie inside one turn, their tokens over their seconds."""
    args = argparse.Namespace(
        data=ROOT / "tests" / "data" / "tiny",
        work=tmp_path,
        seed=1,
        log_every=1,
        curve=0,
        nmt_set=[],
        minutes=0,
        updates=40,
        nmt_config=ROOT / "configs" / "tiny.yaml",
        turns=Turns(1.0),
    )
    rows = together(
        [lambda n=n: nmt_toolkit.nmt_train(f"nmt {n}", "fp32", args, tmp_path / n) for n in "ab"]
    )
    for row, other in zip(rows, reversed(rows), strict=True):
        assert row.steps == 40 and len(row.window_times) == 40
        assert row.window_times == sorted(row.window_times)
        where = inside(row.window_times, row.turns)
        kept = [w for w, k in zip(row.windows, where, strict=True) if k >= 0]
        assert kept and len(kept) < len(row.windows)  # some span a stop
        took = [
            row.window_times[i] - row.window_times[i - 1] for i, k in enumerate(where) if k >= 0
        ]
        rate = sum(w * t for w, t in zip(kept, took, strict=True)) / sum(took)
        assert row.tokens_per_s == pytest.approx(rate)
        assert row.budget_end >= row.window_times[-1]  # it ended before any budget did
        for s, e in row.turns:  # never two at once
            assert not any(s < e2 and s2 < e for s2, e2 in other.turns)


def test_a_rows_turns_are_kept_in_its_file():
    """--out keeps each row's turns and its windows' times, read back by every reader of
    runs (`previous_run`: runs.py, seeds.py, --redecode), as any other field."""
    row = common.Result(
        "nmt fp32",
        2500.0,
        [1.0, 2.0, 3.0],
        window_times=[10.0, 11.0, 12.5],
        turns=[[9.0, 13.0]],
        budget_end=13.0,
    )
    assert previous._typed(common.Result, dataclasses.asdict(row), "run") == row
    assert common.turn_rates(row) == {11.0: 3.0}  # the turn's middle; its first window out
    bad = {**dataclasses.asdict(row), "turns": [[9.0, "soon"]]}
    with pytest.raises(ValueError, match="turns"):
        previous._typed(common.Result, bad, "run")


# SIGTERM given by the kernel to a job's thread (the only one not blocking it), while the
# main thread waits in `together` for a job that would take a minute.
TERMINATED_WHILE_WAITING = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from peers.turns import together
signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the job's thread inherits it

def job():
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)

together([job])
"""


def test_a_signal_another_thread_takes_still_ends_the_wait_for_the_trainings():
    """compare_peers.py --interleave, sent SIGTERM while its trainings ran, once went on: the
    kernel gave the signal to another thread, and the main thread, waiting for the jobs'
    threads without end, never ran its handler (so the trainings were never killed)."""
    start = time.monotonic()
    done = run_alone(
        [TERMINATED_WHILE_WAITING, str(ROOT / "scripts")], hung="the signal was never handled"
    )
    assert done.returncode == 1 and done.stderr.strip().endswith("terminated"), done.stderr
    assert time.monotonic() - start < 30


def test_a_row_without_a_window_to_read_its_speed_from_is_said_why():
    """A run too short for a log window inside one of a row's turns (or, one after another,
    for any window) printed "0" tokens/s and "0.0%" of the limit without a word."""
    interleaved = common.Result("nmt fp32", 0.0, [2785.0], turns=[[1.0, 16.0]])
    alone = common.Result("OpenNMT-py 3.5.1", 0.0)
    limits = {"fp32": common.Limit("fp32", 4_000.0, 190.0, 47.0, 240, "oneDNN 100%")}
    rows = compare_peers.table([alone, interleaved], None, limits).splitlines()[2:]
    assert all(row.split(" | ")[1:3] == ["-", "-"] for row in rows)
    said = compare_peers.missing([alone, interleaved], limits)
    assert said[0] == "OpenNMT-py 3.5.1: no tokens/s (no log window to read them from)"
    assert said[3] == (
        "nmt fp32: no tokens/s (no log window inside one of its turns, after the turn's first, "
        "to read them from)"
    )


@pytest.mark.parametrize("interleave", [0, 20], ids=["one after another", "taking turns"])
def test_the_limit_takes_as_many_passes_taking_turns_as_one_after_another(interleave, monkeypatch):
    """A pass after each toolkit that trained rows, in both modes: on the Zen 5 the bf16
    limit fell near 750 or near 880 GFLOP/s from pass to pass, and one pass after all the
    rows read it low (session 50). A toolkit with no row asked for takes no pass of its own."""
    row = common.Result("a row", 1000.0)
    adapters = [
        argparse.Namespace(run_all=lambda *_: ([row], [])),
        argparse.Namespace(run_all=lambda *_: ([], [])),
        argparse.Namespace(run_all=lambda *_: ([row, row], [])),
    ]
    passes: list[object] = []
    monkeypatch.setattr(compare_peers, "ADAPTERS", adapters)
    monkeypatch.setattr(compare_peers, "limit_pass", lambda args, *_: passes.append(args.turns))
    args = argparse.Namespace(interleave=interleave, again=None, turns=None)
    found = compare_peers._train_rows(args, None, set(), {})
    assert [len(rows) for rows, _ in found] == [1, 0, 2]
    assert passes == [None, None]  # two, each with no training in turns
