"""Training under torchrun (PyTorch DDP, gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from train_setup import (
    ROOT,
    TINY,
    ddp_groups,
    step_once,
    tiny_model_and_batches,
    torchrun_2,
)

from nmt.checkpoint import load_checkpoint


@pytest.mark.slow
def test_ddp_with_two_gloo_processes(tmp_path):
    run_dir = tmp_path / "ddp"
    cmd = [
        *torchrun_2(29500),
        "-m",
        "nmt",
        "train",
        str(TINY),
        "--set",
        f"data.dir={ROOT / 'tests/data/tiny'}",
        "--set",
        f"run.dir={run_dir}",
        "--set",
        "train.max_steps=4",
        "--set",
        "train.log_every=1",
        "--set",
        "train.threads=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "2 processes" in out.stdout
    assert out.stdout.count("model:") == 1 and out.stdout.count("data: train") == 1  # rank 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # written once, by rank 0
    assert load_checkpoint(run_dir / "last.pt")["position"]["step"] == 4


DDP_SCRIPT = """
import sys, torch, torch.distributed as dist
from torch import nn
sys.path.insert(0, {tests!r})
from train_setup import ddp_groups, tiny_model_and_batches
from nmt.batching import collate
from nmt.optim import build_optimizer
from nmt.step import make_scaler, update
dist.init_process_group("gloo")
rank = dist.get_rank()
cfg, model, rows, tgts = tiny_model_and_batches()
net = nn.parallel.DistributedDataParallel(model)
batch = ddp_groups(rows, tgts)[rank]
cpu = torch.device("cpu")
update(net, [batch], optimizer=build_optimizer(cfg.train, model.parameters()),
       scaler=make_scaler(cpu, "fp32"), device=cpu, precision="fp32", label_smoothing=0.1,
       clip_norm=1.0, world=2)
if rank == 0:
    torch.save(model.state_dict(), {out!r})
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_ddp_update_equals_one_process_on_the_union_of_the_batches(tmp_path):
    script = tmp_path / "ddp_step.py"
    out = tmp_path / "ddp.pt"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests"), out=str(out)))
    cmd = [
        *torchrun_2(29700),
        str(script),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cfg, model, rows, tgts = tiny_model_and_batches()
    step_once(model, cfg, ddp_groups(rows, tgts))  # one process, both batches accumulated
    ddp = torch.load(out, weights_only=True)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-5, atol=1e-6)
