"""Faults a long training run meets: kill -9 at any moment, a full disk, a refused
permission, `--overwrite` pointed at a folder that is not a run, a malicious checkpoint."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nmt.config import ConfigError, load_config
from nmt.data import prepare
from nmt.errors import NmtError
from nmt.files import FileError, atomic_write
from nmt.run_dir import RunFiles
from nmt.train import fit

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TINY_DATA = ROOT / "tests" / "data" / "tiny"


def overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.dir={TINY_DATA}",
        f"run.dir={run_dir}",
        "train.log_every=1",
        "run.tensorboard=false",
        *extra,
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- kill -9

# The child: `nmt train` itself; with NMT_TEST_SLOW_SAVE set, a checkpoint write stops half
# way (after printing "writing") so that the parent can kill it there.
CHILD = """
import os, sys, time
if os.environ.get("NMT_TEST_SLOW_SAVE"):
    import nmt.checkpoint
    def slow(path, data):
        with open(path.with_name("." + path.name + ".partial.tmp"), "wb") as f:
            f.write(b"the first bytes of a checkpoint")
        print("writing", flush=True)
        time.sleep(60)
    nmt.checkpoint.atomic_write = slow
from nmt.cli import app
sys.argv = ["nmt", *sys.argv[1:]]
app()
"""


def _train_and_kill(args: list[str], *, after_line: str, slow_save: bool = False) -> str:
    """Start `nmt train ARGS`, SIGKILL it once a stdout line contains `after_line`."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    if slow_save:
        env["NMT_TEST_SLOW_SAVE"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if after_line in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=120)
    return "".join(seen)


def test_kill_9_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    common = ["train.max_steps=30", "model.dropout=0.3", "train.threads=2"]
    whole = load_config(TINY, overrides(tmp_path / "whole", *common))
    torch.set_num_threads(2)
    fit(whole, log=lambda _: None)

    args = [str(TINY), *(f"--set={o}" for o in overrides(tmp_path / "killed", *common))]
    rng = random.Random(7)
    # Before the first checkpoint, at random steps, and in the middle of a checkpoint write.
    steps = sorted(rng.sample(range(2, 29), 4))  # increasing, so that each is reached
    moments = [("model:", False)] + [(f"step {k}:", False) for k in steps]
    moments.insert(3, ("writing", True))
    for i, (line, slow) in enumerate(moments):
        out = _train_and_kill(args + (["--resume"] if i else []), after_line=line, slow_save=slow)
        assert line in out, out[-2000:]
        for ckpt in (tmp_path / "killed").glob("*.pt"):
            load_checkpoint(ckpt)  # whatever the moment, every checkpoint left is whole
    done = subprocess.run(
        [sys.executable, "-m", "nmt", "train", *args, "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped by max_steps at step 30" in done.stdout
    a = load_checkpoint(whole.run_dir / "last.pt")["model"]
    b = load_checkpoint(tmp_path / "killed" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    whole_rows = [json.loads(x) for x in (whole.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31))  # no step logged twice
    assert rows[-1]["loss"] == whole_rows[-1]["loss"]


def _train_sending(args: list[str], signals_at: dict[int, int], **popen) -> tuple[int, str]:
    """`nmt train args`, sent each of `signals_at` (step -> signal) once that step is logged:
    its exit status and what it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **popen,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        for step, sig in signals_at.items():
            # Once: "SIGTERM at step 3: saved" matches too, and a second signal stops at once.
            if f"step {step}:" in line and sum(f"step {step}:" in x for x in lines) == 1:
                proc.send_signal(sig)
    return proc.wait(timeout=120), "".join(lines)


def test_sigterm_saves_and_exits_143(tmp_path):
    args = [str(TINY), *(f"--set={o}" for o in overrides(tmp_path / "run", "train.max_steps=300"))]
    code, text = _train_sending(args, {3: signal.SIGTERM})
    assert code == 143, text[-2000:]
    assert "SIGTERM at step" in text and "--resume" in text and "Traceback" not in text
    assert load_checkpoint(tmp_path / "run" / "last.pt")["position"]["step"] >= 3


def test_a_training_started_with_ctrl_c_ignored_keeps_it_ignored(tmp_path):
    """A shell script's `nmt train ... &` starts with SIGINT ignored, so that the script's
    Ctrl-C leaves it running: nmt keeps it so (it had stopped the training), and SIGTERM
    still stops it with a checkpoint."""
    args = [str(TINY), *(f"--set={o}" for o in overrides(tmp_path / "run", "train.max_steps=300"))]
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 as `&` does
    code, text = _train_sending(args, {3: signal.SIGINT, 6: signal.SIGTERM}, preexec_fn=ignored)
    assert code == 143, text[-2000:]
    assert "SIGINT" not in text and "SIGTERM at step" in text and "Traceback" not in text
    assert load_checkpoint(tmp_path / "run" / "last.pt")["position"]["step"] >= 6


# --------------------------------------------------------------------------- disk full


def _fail_writes(monkeypatch, err: int, name: str = "") -> None:
    """Atomic writes of files called `name` (all, by default) fail with `err` once their
    bytes are written, as on a full disk."""
    import nmt.files

    real = os.fsync

    def failing_fsync(fd: int) -> None:
        if f".{name}" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(err, os.strerror(err))
        real(fd)

    monkeypatch.setattr(nmt.files.os, "fsync", failing_fsync)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES])
def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, err):
    cfg = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=2"))
    fit(cfg, log=lambda _: None)
    before = snapshot(cfg.run_dir)
    more = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=4"))
    _fail_writes(monkeypatch, err, "last.pt")
    with pytest.raises(FileError) as info:
        fit(more, resume=True, log=lambda _: None)
    assert os.strerror(err) in str(info.value) and "last.pt" in str(info.value)
    assert "the previous file is unchanged" in str(info.value)
    monkeypatch.undo()
    assert load_checkpoint(cfg.run_dir / "last.pt")["position"]["step"] == 2
    after = snapshot(cfg.run_dir)
    assert after["last.pt"] == before["last.pt"] and after["best.pt"] == before["best.pt"]
    assert not list(cfg.run_dir.glob(".*.tmp"))


def test_a_failed_tokenizer_write_leaves_no_partial_model(tmp_path, monkeypatch):
    cfg = load_config(TINY, overrides(tmp_path / "run"))
    _fail_writes(monkeypatch, errno.ENOSPC)
    with pytest.raises(FileError, match="spm.model: cannot write .No space left on device"):
        prepare(cfg, log=lambda _: None)
    monkeypatch.undo()
    assert not list((tmp_path / "run").glob("spm*")) and not list((tmp_path / "run").glob(".*"))


def test_a_failed_cache_write_is_a_clear_error_and_keeps_nothing_half_written(
    tmp_path, monkeypatch
):
    import datasets

    cfg = load_config(TINY, overrides(tmp_path / "run"))

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)
    with pytest.raises(FileError, match="prepared-.*: cannot write .No space left on device"):
        prepare(cfg, log=lambda _: None)
    monkeypatch.undo()
    data = tmp_path / "run" / "data"
    assert not list(data.glob("prepared-*")) and not list(data.glob(".prepared-*"))
    assert (
        prepare(cfg, log=lambda _: None).report.cached is False
    )  # and it works once space is back


def test_a_metrics_row_cut_short_is_dropped_on_resume(tmp_path):
    """A kill or a full disk in the middle of a metrics row leaves it cut short, without its
    newline: resuming drops it (and any line that is not a row) instead of failing on it or
    writing the next row onto it."""
    cfg = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=2"))
    fit(cfg, log=lambda _: None)
    metrics = cfg.run_dir / "metrics.jsonl"
    whole = metrics.read_bytes()
    metrics.write_bytes(whole + b'\xff\n[1]\n{"step": "2"}\n{"step": 2.5}\n{"step": 3, "lo')
    more = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=3"))
    fit(more, resume=True, log=lambda _: None)
    text = metrics.read_bytes()
    assert text.startswith(whole) and text.endswith(b"\n")
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["step"] for r in rows][-2:] == [2, 3] and rows[-1]["step"] == 3
    metrics.write_bytes(text.rstrip(b"\n"))  # a whole row, its newline lost
    fit(load_config(TINY, overrides(tmp_path / "run", "train.max_steps=4")), resume=True,
        log=lambda _: None)  # fmt: skip
    assert [json.loads(line)["step"] for line in metrics.read_bytes().splitlines()][-2:] == [3, 4]


def test_atomic_write_gives_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "x.bin", b"data")
    finally:
        os.umask(old)
    assert (tmp_path / "x.bin").stat().st_mode & 0o777 == 0o644


def test_tokenizer_models_are_created_with_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        prepare(load_config(TINY, overrides(tmp_path / "run")), log=lambda _: None)
    finally:
        os.umask(old)
    for name in ("spm.model", "spm.json"):
        assert (tmp_path / "run" / name).stat().st_mode & 0o777 == 0o644, name


# --------------------------------------------------------------------------- --overwrite


def test_overwrite_deletes_a_previous_run_and_nothing_else(tmp_path):
    cfg = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=2"))
    fit(cfg, log=lambda _: None)
    (cfg.run_dir / "eval").mkdir()
    (cfg.run_dir / "eval" / "test.beam5.hyp").write_text("x\n")
    fit(cfg, overwrite=True, log=lambda _: None)
    assert not (cfg.run_dir / "eval").exists()
    assert (cfg.run_dir / "last.pt").is_file()


@pytest.mark.parametrize(
    "foreign",
    ["notes.txt", "src/model.py", "data/multi30k/train.en", "tensorboard/my_plot.png"],
)
def test_overwrite_refuses_a_directory_holding_anything_else_and_touches_nothing(tmp_path, foreign):
    project = tmp_path / "project"
    cfg = load_config(TINY, overrides(project, "train.max_steps=2"))
    fit(cfg, log=lambda _: None)  # a run, and then the user's own files beside it
    (project / foreign).parent.mkdir(parents=True, exist_ok=True)
    (project / foreign).write_text("the user's work")
    before = snapshot(project)
    with pytest.raises(NmtError) as info:
        fit(cfg, overwrite=True, log=lambda _: None)
    assert "nothing was deleted" in str(info.value)
    assert str(project / foreign.split("/")[0]) in str(info.value)
    assert snapshot(project) == before


def test_overwrite_of_the_current_directory_is_refused(tmp_path):
    (tmp_path / "README.md").write_text("my project")
    (tmp_path / "last.pt").write_text("not even a checkpoint")
    run = RunFiles(Path("."), keep_last=1)
    with pytest.raises(NmtError, match="README.md"):
        run.claim(resume=False, overwrite=True)
    assert (tmp_path / "README.md").read_text() == "my project"
    assert (tmp_path / "last.pt").read_text() == "not even a checkpoint"


# --------------------------------------------------------------------------- hostile input


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_crafted_to_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    with path.open("wb") as f:
        pickle.dump({"format": 1, "model": _RunsCode(marker)}, f)
    torch.save({"format": 1, "payload": _RunsCode(marker)}, tmp_path / "evil2.pt")
    for p in (path, tmp_path / "evil2.pt"):
        with pytest.raises(CheckpointError) as info:
            load_checkpoint(p)
        assert "\n" not in str(info.value) and str(p) in str(info.value)
    assert not marker.exists()


def test_yaml_is_read_safely(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "evil.yaml"
    bad.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError):
        load_config(bad)
    assert not marker.exists()


def test_nothing_in_the_package_starts_a_shell_or_evaluates_text():
    import re

    banned = re.compile(r"subprocess|os\.system|os\.popen|shell=True|(?<![.\w])(eval|exec)\(")
    for path in (ROOT / "nmt").glob("*.py"):
        found = banned.search(path.read_text(encoding="utf-8"))
        assert found is None, f"{path.name}: {found.group(0) if found else ''}"


def test_checkpoint_save_and_load_round_trip_plain_data(tmp_path):
    save_checkpoint({"x": torch.tensor([1, 2]), "name": "run"}, tmp_path / "a.pt")
    state = load_checkpoint(tmp_path / "a.pt")
    assert state["name"] == "run" and state["x"].tolist() == [1, 2]


@pytest.mark.parametrize("make", ["folder", "fifo"])
def test_something_else_in_the_metrics_place_is_one_line_on_resume(tmp_path, make):
    """metrics.jsonl is read back on resume: a folder in its place was a traceback, and a pipe
    blocked the run for ever (`nmt.files.read_back` never opens one). One line, left as it was."""
    cfg = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=2"))
    fit(cfg, log=lambda _: None)
    metrics = cfg.run_dir / "metrics.jsonl"
    metrics.unlink()
    metrics.mkdir() if make == "folder" else os.mkfifo(metrics)
    more = load_config(TINY, overrides(tmp_path / "run", "train.max_steps=3"))
    with pytest.raises(NmtError) as info:
        fit(more, resume=True, log=lambda _: None)
    message = str(info.value)
    assert message.startswith(f"{metrics}: not the metrics nmt writes (") and "\n" not in message
    assert metrics.is_dir() if make == "folder" else stat.S_ISFIFO(os.lstat(metrics).st_mode)
