"""What the training tests share: the tiny config trained for a few steps, its metrics, a
tiny model with hand-made batches, and torchrun on a port of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from nmt.batching import collate
from nmt.config import Config, config_from_dict, load_config
from nmt.model import build_model
from nmt.optim import build_optimizer
from nmt.step import make_scaler, update

ROOT = Path(__file__).resolve().parents[1]

TINY = ROOT / "configs" / "tiny.yaml"


def tiny(tmp_path: Path, *overrides: str) -> Config:
    """configs/tiny.yaml with absolute data and run paths, trained for a few steps."""
    return load_config(
        TINY,
        [
            f"data.dir={ROOT / 'tests/data/tiny'}",
            f"run.dir={tmp_path / 'run'}",
            "train.max_steps=6",
            "train.log_every=1",
            "run.tensorboard=false",
            *overrides,
        ],
    )


def metrics(cfg: Config) -> list[dict]:
    lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def tiny_model_and_batches():
    cfg = config_from_dict(
        {"model": {"emb_size": 8, "enc_hidden": 8, "dec_hidden": 16, "dropout": 0.0}}
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=30, tgt_vocab_size=30, shared_vocab=True)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (3, 5, 4, 6)]
    tgts = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (4, 2, 6, 5)]
    return cfg, model, rows, tgts


def ddp_groups(rows, tgts):
    """Two batches with very different token counts: 1 pair and 3 pairs."""
    return [collate(rows[:1], tgts[:1], [0]), collate(rows[1:], tgts[1:], [1, 2, 3])]


def torchrun_2(base_port: int, log_dir: Path) -> list[str]:
    """`torchrun --nproc_per_node 2` on a port of its own (tests may run side by side),
    keeping its logs in `log_dir`: without one, torchrun leaves a `torchelastic_*` folder
    in the machine's temporary folder at every run."""
    port = base_port + os.getpid() % 200
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "--log-dir",
        str(log_dir),
    ]


def run_script_under_torchrun(script: Path, text: str, base_port: int, **fields: str) -> None:
    """Write `text` (a Python script, formatted with `tests`, this folder, and `fields`) to
    `script` and run it in two gloo processes, one thread each; fail with its stderr if it
    fails."""
    script.write_text(text.format(tests=str(ROOT / "tests"), **fields))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*torchrun_2(base_port, script.parent / "torchrun-logs"), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (script.parent / "torchrun-logs").is_dir()  # its logs went here, not to /tmp


def step_once(model, cfg, group, scaler=None, precision="fp32", optimizer=None):
    """One update on the CPU; a fresh optimizer unless `optimizer` (updates in a row)."""
    opt = optimizer or build_optimizer(cfg.train, model.parameters())
    scaler = scaler or make_scaler(torch.device("cpu"), precision)
    return update(
        model,
        group,
        optimizer=opt,
        scaler=scaler,
        device=torch.device("cpu"),
        precision=precision,
        label_smoothing=0.1,
        clip_norm=1.0,
    )
