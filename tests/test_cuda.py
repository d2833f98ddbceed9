"""The GPU paths on a GPU: skipped where torch sees none (every CPU-only machine, CI too).

`tests/test_gpu_paths.py` checks their logic on the CPU; these run them: an update that
never makes the host wait, in each precision; fp16's loss scaling skipping an overflowed
update; the GPU computing what the CPU computes (update and searches); and the command line
training, resuming, translating and evaluating there, and DDP over NCCL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_search import BEAM, LIMITS, random_batch, tiny_model
from torch import nn
from train_setup import ROOT, TINY, ddp_groups, tiny_model_and_batches

from nmt.checkpoint import load_checkpoint
from nmt.optim import build_optimizer
from nmt.search import beam_search, greedy
from nmt.step import make_scaler, update

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU (torch sees none on this machine)"
)
GPU, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.fixture
def full_fp32():
    """float32 products in float32 (nmt trains with TF32 on), to compare with the CPU."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _trainer(
    device: torch.device, precision: str, *, init_scale: float | None = None, ddp: bool = False
):
    """The tiny model on `device` (wrapped in DDP with `ddp`, as if one of two ranks), its
    optimizer and scaler, its two batches there, and a function making one update of them."""
    cfg, model, rows, tgts = tiny_model_and_batches()
    model = model.to(device).train()
    net = nn.parallel.DistributedDataParallel(model, device_ids=None) if ddp else model
    optimizer = build_optimizer(cfg.train, net.parameters())
    scaler = (
        make_scaler(device, precision)  # type: ignore[arg-type]
        if init_scale is None
        else torch.amp.GradScaler(device.type, init_scale=init_scale)
    )
    group = [b.to(device, non_blocking=True) for b in ddp_groups(rows, tgts)]

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        return update(
            net,
            group,
            optimizer=optimizer,
            scaler=scaler,
            device=device,
            precision=precision,  # type: ignore[arg-type]
            label_smoothing=0.1,
            clip_norm=1.0,
            world=2 if ddp else 1,
        )

    return model, scaler, step


def _without_host_syncs(step):
    """`step()` under CUDA's sync debug mode, which raises at any call that blocks the host
    on the device (a value read, a blocking copy, a data-dependent size)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_an_update_on_the_gpu_never_makes_the_host_wait(precision):
    """A whole update: forward, loss, backward, unscaling, clipping and the fused step."""
    _, _, step = _trainer(GPU, precision)
    step()  # the first: the optimizer's state, cuBLAS's handles and workspaces
    loss, norm = _without_host_syncs(step)
    assert torch.isfinite(loss).item() and torch.isfinite(norm).item()


def test_an_overflowed_fp16_update_is_skipped_and_the_scale_halved_on_the_device():
    model, scaler, step = _trainer(GPU, "fp16", init_scale=2.0**60)  # fp16 gradients overflow
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, norm = step()
    assert not torch.isfinite(norm).item()
    assert scaler.get_scale() == 2.0**59
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    scaler.update(2.0**16)  # a scale that fits: updates go on
    _, norm = step()
    assert torch.isfinite(norm).item()
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_an_fp32_update_on_the_gpu_equals_the_cpu_one(full_fp32):
    gpu_model, _, gpu_step = _trainer(GPU, "fp32")
    cpu_model, _, cpu_step = _trainer(CPU, "fp32")
    for _ in range(3):
        gl, gn = gpu_step()
        cl, cn = cpu_step()
        torch.testing.assert_close(gl.cpu(), cl, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gn.cpu(), cn, rtol=1e-4, atol=1e-5)
    cpu_state = cpu_model.state_dict()
    for name, value in gpu_model.state_dict().items():
        torch.testing.assert_close(value.cpu(), cpu_state[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("copy", [False, True], ids=["", "copy"])
@pytest.mark.parametrize(("attention", "decoder"), [("concat", "bahdanau"), ("dot", "luong")])
def test_searches_on_the_gpu_find_what_they_find_on_the_cpu(full_fp32, attention, decoder, copy):
    model = tiny_model(attention, decoder, decoder == "luong", copy=copy)
    src, lens = random_batch([6, 2, 9, 4, 7])
    on_cpu = [
        greedy(model, src, lens, **LIMITS),
        beam_search(model, src, lens, beam=4, nbest=2, **BEAM),
    ]
    model = model.to(GPU)
    on_gpu = [
        greedy(model, src.to(GPU), lens, **LIMITS),
        beam_search(model, src.to(GPU), lens, beam=4, nbest=2, **BEAM),
    ]
    for want, got in zip(on_cpu, on_gpu, strict=True):
        got_hyps = [[(h.tokens, h.score) for h in hyps] for hyps in got.hypotheses]
        want_hyps = [
            [(h.tokens, pytest.approx(h.score, abs=1e-4)) for h in hyps] for hyps in want.hypotheses
        ]
        assert got_hyps == want_hyps


# ---------------------------------------------------------------- the command line


def _nmt(*args: str, launcher: tuple[str, ...] = ("-m", "nmt")) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *launcher, *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done


def _train_args(run_dir: Path, precision: str, steps: int) -> list[str]:
    sets = {
        "data.dir": ROOT / "tests/data/tiny",
        "run.dir": run_dir,
        "train.device": "cuda",
        "train.precision": precision,
        "train.max_steps": steps,
        "train.log_every": 5,
    }
    return ["train", str(TINY), *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_train_resume_translate_and_eval_on_the_gpu(tmp_path, precision):
    run_dir = tmp_path / "run"
    _nmt(*_train_args(run_dir, precision, 20))
    done = _nmt(*_train_args(run_dir, precision, 40), "--resume")
    assert load_checkpoint(run_dir / "last.pt")["position"]["step"] == 40, done.stdout
    for beam in ("1", "3"):
        out = _nmt(
            "translate",
            "a man is eating .",
            "--model",
            str(run_dir),
            "--device",
            "cuda",
            "--beam",
            beam,
        )
        assert out.stdout.strip()
    _nmt("eval", "--model", str(run_dir), "--device", "cuda", "--bleu")


def test_a_ddp_update_over_nccl_never_makes_the_host_wait():
    """One GPU here, so one rank: NCCL refuses two ranks on one device. The code runs as
    under torchrun: the NCCL group, DDP's bucketed gradient all-reduce, and `update`'s
    all-reduce of the token count (asked for with world=2: the count is then halved, which
    is wrong arithmetic for one rank but the same collective and division on the device)."""
    port = 29700 + os.getpid() % 200
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        _, _, step = _trainer(GPU, "bf16", ddp=True)
        # DDP rebuilds its buckets once, at the forward after the first backward (a sync
        # of its own, once a run): two updates before the one watched
        for _ in range(2):
            step()
        loss, norm = _without_host_syncs(step)
        assert torch.isfinite(loss).item() and torch.isfinite(norm).item()
    finally:
        dist.destroy_process_group()
