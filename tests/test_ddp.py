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
    run_script_under_torchrun,
    step_once,
    tiny_model_and_batches,
    torchrun_2,
)

from nmt.checkpoint import load_checkpoint
from nmt.optim import build_optimizer
from nmt.smoothing import Smoothed


@pytest.mark.slow
def test_ddp_with_two_gloo_processes(tmp_path):
    run_dir = tmp_path / "ddp"
    cmd = [
        *torchrun_2(29500, tmp_path / "torchrun-logs"),
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
from nmt.optim import build_optimizer
from nmt.smoothing import Smoothed
from nmt.step import make_scaler, update
dist.init_process_group("gloo")
rank = dist.get_rank()
cfg, model, rows, tgts = tiny_model_and_batches()
if rank == 1 and {apart}:  # a replica that starts apart: DDP's first broadcast (and the
    with torch.no_grad():  # average's first update) must make it rank 0's
        for p in model.parameters():
            p.add_(1.0)
smoothed = Smoothed(model, {factor}) if {factor} else None  # made before the wrap, as in nmt.train
net = nn.parallel.DistributedDataParallel(model)
batch = ddp_groups(rows, tgts)[rank]
cpu = torch.device("cpu")
opt = build_optimizer(cfg.train, model.parameters())
for step in range(1, {updates} + 1):
    update(net, [batch], optimizer=opt, scaler=make_scaler(cpu, "fp32"), device=cpu,
           precision="fp32", label_smoothing=0.1, clip_norm=1.0, world=2)
    if smoothed is not None:
        smoothed.update(step)
saved = model if smoothed is None else smoothed.model
torch.save(saved.state_dict(), {out!r} + str(rank))
dist.destroy_process_group()
"""


def ddp_run(tmp_path, *, updates=1, factor=0.0, apart=False) -> list[dict]:
    """DDP_SCRIPT's weights (the average where `factor`) from rank 0 and rank 1."""
    out = str(tmp_path / "ddp.pt")
    fields = {"out": out, "updates": str(updates), "factor": str(factor), "apart": str(apart)}
    run_script_under_torchrun(tmp_path / "ddp_step.py", DDP_SCRIPT, 29700, **fields)
    return [torch.load(f"{out}{rank}", weights_only=True) for rank in (0, 1)]


@pytest.mark.slow
def test_ddp_update_equals_one_process_on_the_union_of_the_batches(tmp_path):
    ddp, _ = ddp_run(tmp_path)
    cfg, model, rows, tgts = tiny_model_and_batches()
    step_once(model, cfg, ddp_groups(rows, tgts))  # one process, both batches accumulated
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_ddp_average_of_the_weights_equals_one_process_on_every_rank(tmp_path):
    """`train.exponential_smoothing` under torchrun: each rank keeps its own average, made
    before the DDP wrap; after three updates both equal one process's on the union of the
    batches, even where rank 1's replica started apart."""
    averages = ddp_run(tmp_path, updates=3, factor=0.5, apart=True)
    cfg, model, rows, tgts = tiny_model_and_batches()
    smoothed = Smoothed(model, 0.5)
    opt = build_optimizer(cfg.train, model.parameters())
    for step in (1, 2, 3):  # one process, both batches accumulated
        step_once(model, cfg, ddp_groups(rows, tgts), optimizer=opt)
        smoothed.update(step)
    expected = smoothed.model.state_dict()
    assert any(not torch.equal(expected[k], v) for k, v in model.state_dict().items())
    for average in averages:
        for k, v in expected.items():
            torch.testing.assert_close(average[k], v, rtol=1e-5, atol=1e-6)
