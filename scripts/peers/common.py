"""What every adapter of `scripts/compare_peers.py` shares: the result row, running a
toolkit's commands (with its peak memory and a time budget), its own virtual environment,
and the data (one sentencepiece model for all, test BLEU as `nmt eval` computes it).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sentencepiece as spm

from nmt import evaluate, signals, typed
from nmt.tokenizer import JOINT_FILE
from peers.limit import Limit, limit_key
from peers.turns import Turns, inside, per_turn, speed, stamp

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "reference_rnn.yaml"
TEST = "test_2016_flickr"
DECODINGS = (("greedy", 1), ("beam5", 5))  # the decoding columns: label, beam size
SPM_RUN = "spm-run"  # in --work: nmt's run of `nmt prepare`, the shared sentencepiece model
REFERENCE = "OpenNMT-py"  # the row every other is compared with (its name starts so)


@dataclass
class Result:
    """One toolkit's (or one nmt precision's) figures."""

    name: str
    tokens_per_s: float = typed.option(0.0, min=0)  # a file saying less is damaged
    windows: list[float] = field(default_factory=list)
    peak_rss_gb: float = 0.0
    steps: int = 0
    decode: dict[str, dict[str, Any]] = field(default_factory=dict)  # greedy/beam5 -> figures
    note: str = ""
    started: float = 0.0  # time.time() when its training command started
    curve: list[dict[str, float]] = field(default_factory=list)  # minutes, step, val_bleu
    precision: str = "fp32"  # what its matrix products run in: the limit it is measured against
    device: str = "cpu"  # where it trained ("cuda": nmt's rows on a GPU; the peers train on CPUs)
    # --interleave (peers.turns): when each window ended and its turns ran, by time.time()
    window_times: list[float] = field(default_factory=list)
    turns: list[list[float]] = field(default_factory=list)
    # time.time() when its running --minutes ran out taking turns (0: it did not take turns,
    # and its budget is --minutes after `started`)
    budget_end: float = 0.0


@dataclass(frozen=True)
class Shared:
    """What every toolkit trains and decodes from: nmt's sentencepiece model, and the
    corpus encoded with it (`pieces/{train,val,test}.{en,fr}`)."""

    spm_model: Path
    pieces: Path


def shared_of(work: Path) -> Shared:
    """Where a --work folder keeps them: nmt's run of `nmt prepare` and the pieces."""
    return Shared(work / SPM_RUN / JOINT_FILE, work / "pieces")


def run(
    cmd: list[str],
    *,
    log: Path,
    env: dict[str, str] | None = None,
    minutes: float = 0,
    turns: Turns | None = None,
) -> int:
    """Run `cmd` with its output in `log`, interrupted (SIGINT, as Ctrl-C) after `minutes`
    (0: until it ends) and killed 2 minutes later if still there. Returns the peak resident
    set in bytes of the process (and of its children it waited for). It runs in its own
    session (Ctrl-C reaches it only through this loop), so if this script stops first (Ctrl-C,
    SIGTERM, an error) its whole process group is killed: no training left running. With
    `turns`, it takes turns with the other trainings there, and its minutes are its own
    running ones (`peers.turns`)."""
    with log.open("w") as out, contextlib.ExitStack() as owned:
        with signals.held(block=False):  # a Ctrl-C while it starts: raised once it is owned
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_sigint_default,
            )
            owned.push(lambda *exc: _killed(proc) if exc[0] else None)
            if turns is not None:
                turns.join(log, proc.pid)
                owned.callback(turns.leave, log)
        status, usage, interrupted_at = _wait(proc.pid, minutes, turns, log)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 and interrupted_at is None:
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}); {log}:\n{tail}")
    return usage.ru_maxrss * 1024


def _sigint_default() -> None:
    """In the child, before it runs: SIGINT at its default, whatever this script inherited.
    `run` ends a peer's budget with SIGINT, as Ctrl-C; started with SIGINT ignored (this
    script run as `nohup ... &` from a shell script, which ignores it for background
    commands) a peer trained on until killed two minutes later, and Joey NMT, which writes
    its checkpoint on that SIGINT, left none to decode."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _killed(proc: subprocess.Popen) -> None:
    """`proc`'s whole process group killed (what is left of it), and `proc` waited for."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _wait(
    pid: int, minutes: float, turns: Turns | None, log: Path
) -> tuple[int, Any, float | None]:
    """Wait for `pid`: SIGINT to its group after `minutes` (0: never), SIGKILL 2 minutes
    later, both counted in its running seconds where it takes `turns`. Its wait status,
    resource usage, and when it was interrupted (None: it was not)."""
    start = time.monotonic()
    interrupted_at = None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage, interrupted_at
        if turns is not None:
            turns.tick()
        now = turns.running(log) if turns is not None else time.monotonic() - start
        if minutes and interrupted_at is None and now > minutes * 60:
            if turns is not None:
                turns.interrupt(log)
            os.killpg(pid, signal.SIGINT)
            interrupted_at = now
        elif interrupted_at is not None and now - interrupted_at > 120:
            os.killpg(pid, signal.SIGKILL)
        time.sleep(0.5)


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run `cmd` to its end; on failure, stop with the end of what it printed."""
    proc = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}):\n{tail}")
    return proc


def ensure_venv(path: Path, steps: list[list[str]]) -> Path:
    """A virtualenv at `path` with `steps` (pip argument lists) installed; its python."""
    python = path / "bin" / "python"
    if (path / ".installed").is_file():
        return python
    sh([sys.executable, "-m", "venv", str(path)])
    sh([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    for args in steps:
        print(f"  pip install {' '.join(args)}", flush=True)
        sh([str(python), "-m", "pip", "install", "--quiet", *args])
    (path / ".installed").write_text("ok\n")
    return python


def median_after_first(windows: list[float]) -> float:
    rest = windows[1:] or windows
    return statistics.median(rest) if rest else 0.0


def train_peer(
    name: str, tag: str, cmd: list[str], pattern: re.Pattern, env: dict, args: argparse.Namespace
) -> Result:
    """Train a peer for --minutes (0: until it stops by itself, as with --updates); its speed
    read from its log (`pattern`: step, tokens/s)."""
    log = args.work / f"{tag}.train.log"
    started = time.time()
    rss = run(cmd, log=log, env=env, minutes=args.minutes, turns=args.turns)
    found = [
        (int(m.group(1)), float(m.group(2)), stamp(line))
        for line in log.read_text().splitlines()
        if (m := pattern.search(line))
    ]
    windows = [tok for _, tok, _ in found]
    steps = found[-1][0] if found else 0
    result = Result(name, median_after_first(windows), windows, rss / 2**30, steps, started=started)
    return timed_by_turns(result, [t for _, _, t in found], args.turns, log)


def turn_rates(result: Result) -> dict[float, float]:
    """`result`'s tokens/s in each of its turns with a window inside (`peers.turns.per_turn`),
    keyed by the time of the turn's middle (none: it took no turns)."""
    times = result.window_times
    rates = per_turn(result.windows, times, inside(times, result.turns))
    return {sum(result.turns[k]) / 2: rate for k, rate in rates.items()}


def timed_by_turns(
    result: Result, times: list[float | None], turns: Turns | None, log: Path
) -> Result:
    """`result` as it took `turns` (None: it did not): its tokens/s from the windows inside
    one of its turns, those turns, and when its budget ran out of running minutes."""
    if turns is None:
        return result
    ran = turns.turns_of(log)
    result.turns = [list(t) for t in ran]
    result.window_times = [t or 0.0 for t in times]
    result.tokens_per_s = speed(result.windows, times, inside(times, ran))
    result.budget_end = turns.interrupted_at(log) or time.time()  # or it ended first
    return result


def encode_pieces(model: Path, data: Path, out: Path) -> None:
    """train/val/test sides as sentencepiece pieces, one sentence a line, for the peers."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", TEST):
        for lang in ("en", "fr"):
            lines = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = sp.encode([line.strip() for line in lines], out_type=str)
            (out / f"{split}.{lang}").write_text(
                "".join(" ".join(p) + "\n" for p in pieces), encoding="utf-8"
            )


def bleu(hyps: list[str], data: Path, split: str = TEST) -> float:
    """sacreBLEU's default BLEU, as `nmt eval --bleu` computes it."""
    refs = (data / f"{split}.fr").read_text(encoding="utf-8").splitlines()
    return evaluate.bleu(hyps, refs).score


def scores(hyps: list[str], data: Path) -> dict[str, float]:
    """Test BLEU, cased sacreBLEU and under the Multi30k shared-task protocol (wmt-mmt)."""
    refs = (data / f"{TEST}.fr").read_text(encoding="utf-8").splitlines()
    mmt = evaluate.bleu(hyps, refs, protocol="wmt-mmt", lang="fr").score
    return {"bleu": bleu(hyps, data), "bleu_wmt_mmt": mmt}


def depiece(path: Path, model: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.decode(line.split()) for line in path.read_text(encoding="utf-8").splitlines()]


def share_of_limit(row: Result, limits: dict[str, Limit]) -> float | None:
    """The row's training tokens/s as a share of the limit of its precision and device that
    its run measured; None where the run measured no such limit."""
    lim = limits.get(limit_key(row.precision, row.device))
    return row.tokens_per_s / lim.tokens_per_s if lim and lim.tokens_per_s else None


def finite(x: object) -> bool:
    """Whether a JSON value is a figure: a finite number (not a bool), as a row's decodings'
    seconds and BLEU are (`Result.decode` holds them untyped)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def model_of(name: str) -> str:
    """A row's model: its name less how it decoded ("nmt fp32, int8 decoding" -> "nmt fp32")."""
    return name.split(", ")[0]


@dataclass
class Decoding:
    """One timed decoding of a row (`label`, one of DECODINGS) that `decode_in_turns` runs:
    the command (`env` its environment), the pattern of the seconds it reports for itself,
    and the hypotheses it wrote, read once it has run."""

    result: Result
    label: str
    cmd: list[str]
    own: re.Pattern
    hyps: Callable[[], list[str]]
    env: dict[str, str] | None = None


def decode_in_turns(decodings: list[Decoding], times: int, data: Path) -> None:
    """Every decoding command run `times` times (`--decode-repeats`), each a fresh process as
    a user would run it, in turns: each command's first run, then each one's second, and so
    on. A small machine's speed drifts by 20 % and more within minutes; run one row's five
    after another's, the drift would fall between the rows and into their ratio, run in turns
    it falls on every row alike. A command's own seconds are the last match of `own`'s group
    in what it printed (the command's when it prints none). Fills each row's `decode[label]`:
    the medians, every own time, and the test BLEU of its hypotheses."""
    own_s: list[list[float]] = [[] for _ in decodings]
    whole_s: list[list[float]] = [[] for _ in decodings]
    for _ in range(times):
        for d, own, whole in zip(decodings, own_s, whole_s, strict=True):
            start = time.perf_counter()
            proc = sh(d.cmd, env=d.env)
            whole.append(time.perf_counter() - start)
            found = d.own.findall(proc.stdout + proc.stderr)
            own.append(float(found[-1]) if found else whole[-1])
    for d, own, whole in zip(decodings, own_s, whole_s, strict=True):
        d.result.decode[d.label] = {
            "seconds": statistics.median(own),
            "command_s": statistics.median(whole),
            "seconds_all": own,
            **scores(d.hyps(), data),
        }
        print(f"  {d.result.name} {d.label}: {d.result.decode[d.label]}", flush=True)
