"""Checkpoints (`nmt.checkpoint`) and the run directory that keeps them (`nmt.run_dir`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.run_dir import OWNER_MARK, RunFiles


def test_step_checkpoints_keep_the_last_k(tmp_path):
    run = RunFiles(tmp_path / "run", keep_last=2)
    run.claim(resume=False, overwrite=False)
    for step in (1, 2, 3):
        run.save({"x": torch.tensor(step)}, step=step, best=step == 2)
    names = sorted(p.name for p in run.dir.iterdir())
    assert names == [OWNER_MARK, "best.pt", "last.pt", "step-2.pt", "step-3.pt"]
    assert load_checkpoint(run.dir / "best.pt")["x"].item() == 2
    assert load_checkpoint(run.dir / "last.pt")["x"].item() == 3


def test_a_kill_during_a_checkpoint_write_leaves_the_previous_one(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"x": torch.tensor(1)}, path)
    child = textwrap.dedent(
        f"""
        import time, torch
        from pathlib import Path
        from nmt.checkpoint import save_checkpoint
        real = torch.save
        def slow_save(obj, f):
            f.write(b"partial bytes of a new checkpoint")
            f.flush()
            print("writing", flush=True)
            time.sleep(60)
        torch.save = slow_save
        save_checkpoint({{"x": torch.tensor(2)}}, Path({str(path)!r}))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert load_checkpoint(path)["x"].item() == 1
