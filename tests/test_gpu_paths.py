"""The GPU and multi-GPU paths, checked on the CPU: ranks that agree on the learning rate and
stay equal, the RNNs' dtype under autocast, the scaler across precisions, device mapping
under torchrun, the collectives' timeout, and the host syncs a step makes."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_model import SHAPES, batch, make_model
from test_search import BEAM, random_batch, tiny_model
from train_setup import ROOT, run_script_under_torchrun, tiny

import nmt.runtime
from nmt.batching import collate
from nmt.decoder import rnn_outside_autocast, run_rnn
from nmt.errors import NmtError
from nmt.runtime import rank_seed, resolve_device, resolve_precision
from nmt.search import beam_search
from nmt.step import token_loss
from nmt.train_state import TrainState, scaler_carries_over

sys.path.insert(0, str(ROOT / "scripts"))
from profile_step import SyncCounter  # noqa: E402

CPU = torch.device("cpu")

# ---------------------------------------------------------------- 1, 7, 9: DDP with gloo

PLATEAU_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
import nmt.train
from train_setup import tiny
from pathlib import Path
from nmt.train_state import TrainState

built = {{}}
real_build = TrainState.build.__func__
def build(cls, *a, **k):
    built["ts"] = real_build(cls, *a, **k)
    return built["ts"]
TrainState.build = classmethod(build)

kwargs = {{}}
class DDP(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, **kw):
        kwargs.update(kw)
        super().__init__(module, **kw)
nmt.train.nn.parallel.DistributedDataParallel = DDP

scores = iter([30.0, 20.0, 10.0, 5.0, 1.0, 0.5])  # every validation worse than the first
nmt.train.validate = lambda *a, **k: {{"val_loss": 1.0, "val_ppl": 2.7, "val_bleu": next(scores)}}
cfg = tiny(Path({tmp!r}), "train.schedule=plateau", "train.plateau_patience=0",
           "train.valid_every=1", "train.max_steps=4", "train.lr=0.001")
nmt.train.fit(cfg, log=lambda _: None)
rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else int(
    __import__("os").environ["RANK"])
ts = built["ts"]
torch.save({{"lr": ts.schedule.lr, "model": ts.model.state_dict(),
            "rng": torch.get_rng_state(), "device_ids": kwargs.get("device_ids", "unset")}},
           Path({tmp!r}) / f"rank{{rank}}.pt")
"""


@pytest.mark.slow
def test_ddp_plateau_cuts_the_learning_rate_on_every_rank_and_the_replicas_stay_equal(tmp_path):
    run_script_under_torchrun(tmp_path / "plateau.py", PLATEAU_SCRIPT, 29900, tmp=str(tmp_path))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["lr"] == r1["lr"] < 0.001 / 4  # three bad validations: three cuts, on both
    for name, weight in r0["model"].items():
        torch.testing.assert_close(r1["model"][name], weight, rtol=0, atol=1e-7, msg=name)
    assert r0["device_ids"] is None and r1["device_ids"] is None  # inputs already on device
    assert not torch.equal(r0["rng"], r1["rng"])  # each rank its own dropout stream


def test_each_rank_gets_its_own_seed_and_a_resumed_run_the_same_one():
    seeds = {rank_seed(1, rank, 100) for rank in range(1, 8)}
    assert len(seeds) == 7 and rank_seed(1, 3, 100) == rank_seed(1, 3, 100)
    assert rank_seed(1, 1, 100) != rank_seed(1, 1, 101)


# ---------------------------------------------------------------- 2, 8: RNN dtype policy


def test_rnns_leave_autocast_on_a_gpu_and_only_there():
    """ATen's cuDNN-RNN autocast wrapper casts to fp16 whatever the dtype: under bf16 (no
    loss scaling) the RNNs would train in unscaled fp16, and each step-by-step call would
    re-cast the weights. On a GPU under autocast they run in float32; on the CPU as given."""
    assert rnn_outside_autocast("cuda", autocast_on=True)
    assert not rnn_outside_autocast("cuda", autocast_on=False)
    assert not rnn_outside_autocast("cpu", autocast_on=True)
    assert not rnn_outside_autocast("cpu", autocast_on=False)


def test_run_rnn_on_the_cpu_is_the_plain_call():
    rnn = torch.nn.GRU(4, 5, batch_first=True)
    x = torch.randn(2, 3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = run_rnn(rnn, x, None)
        want, _ = rnn(x)
    assert torch.equal(got, want)


# ---------------------------------------------------------------- 3: scaler across precisions


@pytest.mark.parametrize(
    ("saved", "resumed", "carried"),
    [
        ("fp16", "fp16", True),
        ("bf16", "fp16", False),
        ("fp32", "fp16", False),
        ("fp16", "bf16", False),
        ("fp16", "fp32", False),
        ("bf16", "fp32", False),
    ],
)
def test_the_scaler_state_is_restored_only_from_fp16_to_fp16(tmp_path, saved, resumed, carried):
    assert scaler_carries_over(saved, resumed) is carried
    cfg = tiny(tmp_path)
    from nmt.tokenizer import train_or_load

    src = (ROOT / "tests/data/tiny/train.en").read_text().splitlines()
    tgt = (ROOT / "tests/data/tiny/train.fr").read_text().splitlines()
    tok = train_or_load(cfg.tokenizer, tmp_path, src, tgt, log=lambda _: None)
    old = TrainState.build(cfg, tok, CPU, saved, None)  # type: ignore[arg-type]
    old.scaler.scale(torch.ones(()))  # the scaler's state starts with its first use
    old.scaler.update(1024.0)  # a scale of its own, to tell restored from fresh
    new = TrainState.build(cfg, tok, CPU, resumed, None)  # type: ignore[arg-type]
    fresh = new.scaler.get_scale()
    new.restore(old.checkpoint())
    assert new.scaler.get_scale() == (1024.0 if carried else fresh)
    if resumed == "fp16" and not carried:
        assert new.scaler.get_scale() == 2.0**16  # fp16 starts scaled, not pinned at 1


# ---------------------------------------------------------------- 4: devices under torchrun


@pytest.fixture
def gpus(monkeypatch):
    def visible(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return visible


@pytest.mark.parametrize(
    ("name", "local_rank", "count", "want"),
    [
        ("cuda", 0, 4, "cuda:0"),
        ("cuda", 3, 4, "cuda:3"),
        ("auto", 2, 4, "cuda:2"),
        ("cuda", 3, 1, "cuda:0"),  # Slurm srun: each task sees its own one GPU
        ("auto", 1, 1, "cuda:0"),
    ],
)
def test_under_torchrun_each_process_takes_the_gpu_of_its_local_rank(
    gpus, name, local_rank, count, want
):
    gpus(count)
    assert resolve_device(name, local_rank, distributed=True) == torch.device(want)


def test_an_explicit_gpu_under_torchrun_and_too_few_gpus_are_refused_in_one_line(gpus):
    gpus(4)
    with pytest.raises(NmtError, match="'cuda:1' under torchrun would put every process"):
        resolve_device("cuda:1", 1, distributed=True)
    with pytest.raises(NmtError, match="LOCAL_RANK 5, but this process sees only 4 GPUs"):
        resolve_device("cuda", 5, distributed=True)
    assert resolve_device("cuda:2", 0) == torch.device("cuda:2")  # alone: as asked


def test_configuring_the_current_gpu_sets_no_device(monkeypatch):
    """`cuda` without an index (scripts/peers/limit.py's device) is the current GPU:
    torch.cuda.set_device refuses an indexless device, so it is not called (seen on an H100)."""
    seen = []
    monkeypatch.setattr(torch.cuda, "set_device", seen.append)
    nmt.runtime.configure_device(torch.device("cuda"))
    nmt.runtime.configure_device(torch.device("cuda:1"))
    assert seen == [torch.device("cuda:1")]


@pytest.mark.parametrize("stages", [["env", "bogus"], []])
def test_gpu_check_refuses_a_bad_stage_list_before_it_installs_anything(tmp_path, stages):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_check.sh"), *stages],
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(out)},
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout.startswith("gpu_check.sh: ")
    assert len(done.stdout.splitlines()) == 1 and not out.exists()


# ---------------------------------------------------------------- 5: collectives' timeout


def test_the_process_group_waits_as_long_as_the_config_says(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: seen.update(kw))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ctx = nmt.runtime.init_distributed("cpu", 150.0)
    assert ctx.world == 2 and ctx.rank == 1
    assert seen == {"backend": "gloo", "timeout": datetime.timedelta(minutes=150)}


# ---------------------------------------------------------------- 6, 9: host syncs


def _moves(counter: SyncCounter) -> list[str]:
    return [s for s in counter.sites if s.split(" ")[0] in ("to", "cpu", "cuda", "copy_")]


def test_a_collated_batch_is_packed_without_copying_sort_indices():
    model = make_model().train()
    rows = [[5, 6], [7, 8, 9, 10, 11], [12, 13, 14]]
    b = collate(rows, [[4], [5, 6], [7]], [0, 1, 2])
    assert b.src_lens.tolist() == [6, 4, 3] and b.index.tolist() == [1, 2, 0]
    with SyncCounter(CPU) as counter:
        token_loss(model(b.src, b.src_lens, b.tgt_in), b.tgt_out, 0.1).backward()
    assert _moves(counter) == []
    src, lens, tgt = batch(SHAPES)  # by hand, not sorted: packing sorts, and copies
    with SyncCounter(CPU) as counter:
        model(src, lens, tgt)
    assert _moves(counter)


def test_a_log_step_reads_the_device_sums_in_one_copy():
    from nmt.report import Stats
    from nmt.stopping import check_bad_steps
    from nmt.train_state import Position

    stats = Stats(CPU)
    for loss in (2.0, float("nan"), 3.0):
        stats.add(torch.tensor(loss), torch.tensor(loss), tokens=10)
    pos = Position()
    cfg = tiny(Path("/nonexistent"))
    with SyncCounter(CPU) as counter:
        check_bad_steps(stats, pos, cfg.train, "none saved")
        row = stats.flush(step=pos.step, epoch=0, lr=1e-3, skipped=pos.skipped_steps)
    reads = [s for s in counter.sites if s.split(" ")[0] in ("item", "tolist")]
    assert sum(counter.sites[s] for s in reads) == 1
    assert pos.skipped_steps == 1 and row["loss"] == pytest.approx(5.0 / 30)


def test_the_weights_average_reads_nothing_back_where_averaged_model_does():
    """`train.exponential_smoothing`'s update after every step: one foreach op, its weight
    from the step count on the host. torch's AveragedModel tests its device-side counter
    (`bool(n_averaged == 0)`) at every update: a sync a step on a GPU."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from nmt.smoothing import Smoothed

    model = make_model().train()
    smoothed = Smoothed(model, 1e-4)
    with SyncCounter(CPU) as counter:
        for step in (1, 2, 3):
            smoothed.update(step)
    assert not counter.sites
    theirs = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    with SyncCounter(CPU) as counter:
        theirs.update_parameters(model)
    assert any(s.startswith("__bool__") for s in counter.sites)


def test_beam_search_copies_nothing_back_inside_its_step_loop():
    """Its one device-to-host copy a step is the EOS test; ended hypotheses stay on the
    device until the search is over (and the lengths are read once at the start)."""
    model = tiny_model("concat", "luong", True)
    src, lens = random_batch([6, 2, 9, 4])
    with SyncCounter(CPU) as counter:
        beam_search(model, src, lens, beam=3, nbest=3, **BEAM)
    copies = {s for s in counter.sites if s.startswith("cpu at nmt/search.py")}
    assert len(copies) == 3, copies  # lengths, the EOS test, the hypotheses at the end


# ---------------------------------------------------------------- 9: bf16 on old GPUs


def test_explicit_bf16_is_refused_where_the_gpu_emulates_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    with pytest.raises(NmtError, match=r"compute capability 7.5, below 8.0\) is emulated"):
        resolve_precision("bf16", torch.device("cuda:0"))
    assert resolve_precision("auto", torch.device("cuda:0")) == "fp16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision("bf16", torch.device("cuda:0")) == "bf16"
    assert resolve_precision("auto", torch.device("cuda:0")) == "bf16"
