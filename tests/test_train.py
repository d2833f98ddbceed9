"""Training: precisions, accumulation, exact resume, checkpoints, refusal to clobber, DDP."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from nmt.batching import collate
from nmt.checkpoint import OWNER_MARK, RunFiles, load_checkpoint, save_checkpoint
from nmt.config import Config, config_from_dict, load_config
from nmt.errors import NmtError
from nmt.model import Output, build_model
from nmt.optim import Schedule, build_optimizer, lr_factor
from nmt.runtime import resolve_precision
from nmt.step import make_scaler, token_loss, update
from nmt.train import fit

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


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # runs/latest goes here
    monkeypatch.delenv("NMT_DATA_DIR", raising=False)


def test_fp32_run_writes_metrics_checkpoints_and_latest(tmp_path):
    cfg = tiny(tmp_path, "train.precision=fp32")
    result = fit(cfg, log=lambda _: None)
    assert result.step == 6 and result.stopped_by == "max_steps"
    rows = metrics(cfg)
    assert [r["step"] for r in rows] == list(range(1, 7))  # the last one with validation
    for row in rows:
        assert {"step", "epoch", "minutes", "loss", "lr", "tokens_per_s", "grad_norm"} <= row.keys()
        assert math.isfinite(row["loss"]) and row["tokens_per_s"] > 0
    assert "val_bleu" in rows[-1] and "val_loss" in rows[-1]
    for name in ("last.pt", "best.pt", "step-6.pt", "config.yaml"):
        assert (cfg.run_dir / name).is_file(), name
    assert (tmp_path / "runs" / "latest").resolve() == cfg.run_dir.resolve()
    state = load_checkpoint(cfg.run_dir / "last.pt")
    assert state["position"]["step"] == 6
    assert config_from_dict(state["config"]) == cfg


def test_bf16_on_cpu_trains_and_loss_falls(tmp_path):
    cfg = tiny(tmp_path, "train.precision=bf16", "train.max_steps=40", "train.lr=0.01")
    fit(cfg, log=lambda _: None)
    losses = [r["loss"] for r in metrics(cfg) if "val_loss" not in r]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert load_checkpoint(cfg.run_dir / "last.pt")["precision"] == "bf16"


def test_same_seed_gives_identical_losses(tmp_path):
    a = tiny(tmp_path / "a")
    b = tiny(tmp_path / "b")
    fit(a, log=lambda _: None)
    fit(b, log=lambda _: None)
    assert [r["loss"] for r in metrics(a)] == [r["loss"] for r in metrics(b)]


def test_resume_reaches_the_same_loss_as_an_uninterrupted_run(tmp_path):
    # dropout on and 3 epochs of the tiny corpus: resume must restore RNG and data order.
    common = ["train.max_steps=14", "model.dropout=0.3", "train.batch_size=16"]
    whole = tiny(tmp_path / "whole", *common)
    fit(whole, log=lambda _: None)
    part = tiny(tmp_path / "part", *common[1:], "train.max_steps=5")
    fit(part, log=lambda _: None)
    with (part.run_dir / "metrics.jsonl").open("a") as f:  # logged after last.pt, then killed
        f.write(json.dumps({"step": 6, "epoch": 1, "loss": 9.9}) + "\n")
    resumed = tiny(tmp_path / "part", *common)
    fit(resumed, resume=True, log=lambda _: None)

    def train_losses(cfg: Config) -> dict[int, float]:
        return {r["step"]: r["loss"] for r in metrics(cfg)}

    assert train_losses(resumed)[14] == train_losses(whole)[14]
    steps = [r["step"] for r in metrics(resumed)]
    assert steps == sorted(set(steps))  # the killed run's row after step 5 is gone
    a = load_checkpoint(whole.run_dir / "last.pt")["model"]
    b = load_checkpoint(resumed.run_dir / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_refuses_to_overwrite_an_existing_run(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=2")
    fit(cfg, log=lambda _: None)
    before = (cfg.run_dir / "last.pt").read_bytes()
    with pytest.raises(NmtError, match="--resume.*--overwrite"):
        fit(cfg, log=lambda _: None)
    assert (cfg.run_dir / "last.pt").read_bytes() == before
    fit(cfg, overwrite=True, log=lambda _: None)
    assert [r["step"] for r in metrics(cfg)] == [1, 2]  # a new metrics.jsonl, not appended


def test_resume_refuses_a_different_model(tmp_path):
    fit(tiny(tmp_path, "train.max_steps=2"), log=lambda _: None)
    with pytest.raises(NmtError, match="model.attention"):
        fit(tiny(tmp_path, "model.attention=dot"), resume=True, log=lambda _: None)
    with pytest.raises(NmtError, match="nothing to resume"):
        fit(tiny(tmp_path / "other"), resume=True, log=lambda _: None)


def _signal_inside_update(monkeypatch, at_call: int, point: str, sig: int) -> None:
    """Make update number `at_call` receive `sig` at `point` inside it."""
    import nmt.train

    real_update = nmt.train.update
    calls = {"n": 0}

    def send(*_):
        os.kill(os.getpid(), sig)

    def update_with_signal(net, group, **kw):
        calls["n"] += 1
        if calls["n"] != at_call:
            return real_update(net, group, **kw)
        if point == "before":
            send()
        hooks = []
        if point == "forward":
            hooks.append(net.register_forward_pre_hook(lambda *_: send()))
        if point == "optimizer step":  # after the weights changed, before the step is counted
            hooks.append(kw["optimizer"].register_step_post_hook(lambda *_: send()))
        try:
            out = real_update(net, group, **kw)
        finally:
            for h in hooks:
                h.remove()
        if point == "after":
            send()
        return out

    monkeypatch.setattr(nmt.train, "update", update_with_signal)


@pytest.mark.parametrize(
    ("point", "sig"),
    [
        ("before", signal.SIGINT),
        ("forward", signal.SIGTERM),
        ("optimizer step", signal.SIGINT),
        ("after", signal.SIGTERM),
    ],
)
def test_a_signal_inside_an_update_stops_at_its_end_and_resume_is_exact(
    tmp_path, monkeypatch, point, sig
):
    common = ["train.max_steps=9", "model.dropout=0.3", "train.batch_size=16"]
    whole = tiny(tmp_path / "whole", *common)
    fit(whole, log=lambda _: None)

    part = tiny(tmp_path / "part", *common)
    with monkeypatch.context() as m:
        _signal_inside_update(m, at_call=4, point=point, sig=sig)
        lines: list[str] = []
        result = fit(part, log=lines.append, config_path="configs/tiny.yaml")
    assert result.signal == sig and result.step == 4  # the update under way was finished
    assert f"{signal.Signals(sig).name} at step 4" in lines[-1]
    assert "Resume with: nmt train configs/tiny.yaml --resume" in lines[-1]
    assert load_checkpoint(part.run_dir / "last.pt")["position"]["step"] == 4
    assert fit(part, resume=True, log=lambda _: None).step == 9
    a = load_checkpoint(whole.run_dir / "last.pt")["model"]
    b = load_checkpoint(part.run_dir / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(part)[-1]["loss"] == metrics(whole)[-1]["loss"]


def test_resuming_a_finished_run_does_nothing(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=3")
    fit(cfg, log=lambda _: None)
    before = (cfg.run_dir / "last.pt").read_bytes(), (cfg.run_dir / "metrics.jsonl").read_text()
    lines: list[str] = []
    result = fit(cfg, resume=True, log=lines.append)
    assert result.step == 3 and result.signal is None
    assert any("already finished (max_steps at step 3); nothing to do" in x for x in lines)
    after = (cfg.run_dir / "last.pt").read_bytes(), (cfg.run_dir / "metrics.jsonl").read_text()
    assert after == before
    # ... until a limit is raised: then it goes on.
    assert fit(tiny(tmp_path, "train.max_steps=5"), resume=True, log=lambda _: None).step == 5


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_over(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=4")
    fit(cfg, log=lambda _: None)
    whole = metrics(cfg)
    for p in cfg.run_dir.glob("*.pt"):  # as if killed after its first log lines
        p.unlink()
    with pytest.raises(NmtError, match="a run already exists here.*--resume"):
        fit(cfg, log=lambda _: None)
    lines: list[str] = []
    assert fit(cfg, resume=True, log=lines.append).step == 4
    assert any("no checkpoint yet" in x and "starting over" in x for x in lines)
    timed = ("tokens_per_s", "minutes")  # wall-clock figures: the only fields that may differ
    again = metrics(cfg)
    assert [{**r, **{k: again[i][k] for k in timed}} for i, r in enumerate(whole)] == again
    # the same rows, none twice


def test_last_pt_is_also_written_every_save_every_minutes(tmp_path, monkeypatch):
    import nmt.train

    saved: list[int] = []
    real = nmt.train.save_checkpoint

    def recording(state, path):
        saved.append(state["position"]["step"])
        real(state, path)

    monkeypatch.setattr(nmt.train, "save_checkpoint", recording)
    cfg = tiny(
        tmp_path, "train.max_steps=4", "train.valid_every=100", "train.save_every_minutes=0.000001"
    )
    fit(cfg, log=lambda _: None)
    assert saved == [1, 2, 3]  # then step 4 is validated and saved with best.pt
    assert load_checkpoint(cfg.run_dir / "last.pt")["position"]["step"] == 4


def _nan_loss_from(monkeypatch, first_call: int, last_call: int = 10**9) -> None:
    import nmt.step

    real = nmt.step.token_loss
    calls = {"n": 0}

    def loss(output, target, smoothing):
        out = real(output, target, smoothing)
        if output.logits.requires_grad:  # training, not validation
            calls["n"] += 1
            if first_call <= calls["n"] <= last_call:
                return out * math.nan
        return out

    monkeypatch.setattr(nmt.step, "token_loss", loss)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_nan_update_is_skipped_and_counted(tmp_path, monkeypatch, precision):
    _nan_loss_from(monkeypatch, 3, 3)
    cfg = tiny(tmp_path, f"train.precision={precision}", "train.max_steps=5")
    fit(cfg, log=lambda _: None)
    rows = metrics(cfg)
    assert [r.get("skipped_steps", 0) for r in rows] == [0, 0, 1, 1, 1]
    assert all(math.isfinite(r["loss"]) for r in rows if "loss" in r)
    weights = load_checkpoint(cfg.run_dir / "last.pt")["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_too_many_bad_updates_in_a_row_stop_training(tmp_path, monkeypatch, precision):
    _nan_loss_from(monkeypatch, 3)
    cfg = tiny(
        tmp_path, f"train.precision={precision}", "train.max_bad_steps=3", "train.valid_every=1"
    )
    with pytest.raises(NmtError) as info:
        fit(cfg, log=lambda _: None)
    message = str(info.value)
    assert message.startswith("stopped at step 5: 3 updates in a row had inf/NaN")
    assert "last.pt holds step 4" in message
    assert "train.lr" in message and "clip_norm" in message and "fp32" in message
    weights = load_checkpoint(cfg.run_dir / "last.pt")["model"]
    assert all(torch.isfinite(w).all() for w in weights.values())


def _tiny_model_and_batches():
    cfg = config_from_dict(
        {"model": {"emb_size": 8, "enc_hidden": 8, "dec_hidden": 16, "dropout": 0.0}}
    )
    torch.manual_seed(0)
    model = build_model(cfg.model, src_vocab_size=30, tgt_vocab_size=30, shared_vocab=True)
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (3, 5, 4, 6)]
    tgts = [torch.randint(4, 30, (n,), generator=g).tolist() for n in (4, 2, 6, 5)]
    return cfg, model, rows, tgts


def _step(model, cfg, group, scaler=None, precision="fp32"):
    opt = build_optimizer(cfg.train, model.parameters())
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


def test_accumulation_gives_the_update_of_one_large_batch():
    cfg, model, rows, tgts = _tiny_model_and_batches()
    big = collate(rows, tgts, [0, 1, 2, 3])
    halves = [collate(rows[:2], tgts[:2], [0, 1]), collate(rows[2:], tgts[2:], [2, 3])]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_big, norm_big = _step(model, cfg, [big])
    after_big = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    loss_acc, norm_acc = _step(model, cfg, halves)
    torch.testing.assert_close(loss_acc, loss_big, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm_acc, norm_big, rtol=1e-5, atol=1e-6)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, after_big[k], rtol=1e-5, atol=1e-6)


def test_grad_scaler_is_unscaled_before_clipping_and_skips_inf_steps():
    cfg, model, rows, tgts = _tiny_model_and_batches()
    batch = collate(rows, tgts, [0, 1, 2, 3])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _, plain_norm = _step(model, cfg, [batch])
    model.load_state_dict(state)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    _, scaled_norm = _step(model, cfg, [batch], scaler, precision="fp16")
    torch.testing.assert_close(scaled_norm, plain_norm, rtol=2e-2, atol=1e-4)

    # An inf in the gradients: the update is skipped and the scale halves.
    model.load_state_dict(state)
    hook = next(model.parameters()).register_hook(lambda g: g * math.inf)
    _, norm = _step(model, cfg, [batch], scaler, precision="fp16")
    hook.remove()
    assert not torch.isfinite(norm)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert scaler.get_scale() == 2.0**11


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_non_finite_updates_are_skipped_in_every_precision(precision):
    cfg, model, rows, tgts = _tiny_model_and_batches()
    batch = collate(rows, tgts, [0, 1, 2, 3])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    scaler = make_scaler(torch.device("cpu"), precision)
    hook = next(model.parameters()).register_hook(lambda g: g * math.nan)
    _, norm = _step(model, cfg, [batch], scaler, precision=precision)
    hook.remove()
    assert not torch.isfinite(norm)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert scaler.get_scale() == 1.0  # pinned: the next updates are not scaled
    _, norm = _step(model, cfg, [batch], scaler, precision=precision)
    assert torch.isfinite(norm)
    assert not all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_token_loss_ignores_padding():
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 0], [6, 0, 0]])
    out = Output(logits=logits, attention=torch.zeros(2, 3, 4), src=torch.ones(2, 4).long())
    full = token_loss(out, target, 0.0)
    manual = sum(
        -torch.log_softmax(logits[b, t], -1)[target[b, t]] for b, t in [(0, 0), (0, 1), (1, 0)]
    )
    torch.testing.assert_close(full, manual)


def test_precision_resolution():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"
    assert resolve_precision("auto", cpu) in ("bf16", "fp32")
    with pytest.raises(NmtError, match="fp16 needs a GPU"):
        resolve_precision("fp16", cpu)


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")],
)
def test_auto_precision_picks_bf16_only_where_the_gpu_has_it_natively(
    monkeypatch, capability, expected
):
    # torch.cuda.is_bf16_supported() also counts emulation (V100, T4): not a reason for bf16.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision("auto", torch.device("cuda", 0)) == expected


def test_schedules():
    def train_cfg(**kw):
        return config_from_dict({"train": kw}).train

    warm = train_cfg(schedule="inverse_sqrt", warmup_steps=4)
    assert [lr_factor(warm, s, None) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(warm, 15, None) == pytest.approx(0.5)
    lin = train_cfg(schedule="linear", min_lr=0.0)
    assert lr_factor(lin, 9, 10) == pytest.approx(0.0)
    cos = train_cfg(schedule="cosine")
    assert lr_factor(cos, 4, 10) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(NmtError, match="known number of steps"):
        Schedule(lin, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), None)

    plateau = train_cfg(schedule="plateau", plateau_patience=0, plateau_factor=0.5, lr=1.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = Schedule(plateau, opt, None)
    sched.validated(10.0)
    sched.step()
    sched.validated(9.0)  # worse: halve
    sched.step()
    assert sched.lr == pytest.approx(0.5)


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


def torchrun_2(base_port: int) -> list[str]:
    """`torchrun --nproc_per_node 2` on a port of its own (tests may run side by side)."""
    port = base_port + os.getpid() % 200
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
    ]


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


# --------------------------------------------------------------------------- stop conditions


def test_valid_every_validates_at_those_steps(tmp_path):
    cfg = tiny(tmp_path, "train.valid_every=2", "train.max_steps=5")
    fit(cfg, log=lambda _: None)
    assert [r["step"] for r in metrics(cfg) if "val_bleu" in r] == [2, 4, 5]  # 5: the end
    assert sorted(p.name for p in cfg.run_dir.glob("step-*.pt")) == ["step-5.pt"]  # keep_last 1


def test_max_epochs_stops_after_whole_epochs(tmp_path):
    cfg = tiny(tmp_path, "train.max_steps=0", "train.max_epochs=2")  # 6 batches an epoch
    result = fit(cfg, log=lambda _: None)
    assert (result.stopped_by, result.step, result.epoch) == ("max_epochs", 12, 2)
    assert [r["step"] for r in metrics(cfg) if "val_bleu" in r] == [6, 12]  # end of each epoch


def test_early_stopping_after_patience_validations_without_gain(tmp_path):
    # lr 0: the BLEU never improves on the first validation.
    cfg = tiny(
        tmp_path, "train.lr=0.0", "train.valid_every=1", "train.patience=2", "train.max_steps=50"
    )
    result = fit(cfg, log=lambda _: None)
    assert (result.stopped_by, result.step) == ("early stopping", 3)
    assert load_checkpoint(cfg.run_dir / "best.pt")["position"]["step"] == 1


def test_max_minutes_stops_on_the_clock(tmp_path, monkeypatch):
    import nmt.train

    clock = {"t": 1000.0}

    def monotonic() -> float:  # each reading is 6 seconds later
        clock["t"] += 6.0
        return clock["t"]

    monkeypatch.setattr(nmt.train.time, "monotonic", monotonic)
    cfg = tiny(
        tmp_path, "train.max_minutes=0.5", "train.max_steps=100", "train.save_every_minutes=null"
    )
    result = fit(cfg, log=lambda _: None)
    assert result.stopped_by == "max_minutes" and 0 < result.step < 10
    assert "val_bleu" in metrics(cfg)[-1]  # the run validates and saves before it stops


def test_a_checkpoint_written_by_fit_translates(tmp_path):
    from nmt.translate import Translator

    cfg = tiny(tmp_path, "train.max_steps=30")
    fit(cfg, log=lambda _: None)
    translator = Translator.from_checkpoint(cfg.run_dir)
    assert translator.path == cfg.run_dir / "best.pt"
    assert translator.config == cfg
    (t,) = translator.translate(["A dog runs in the park."], beam=2)
    assert t.text and t.attention.shape == (len(t.tgt_labels), len(t.src_tokens))


DDP_SCRIPT = """
import sys, torch, torch.distributed as dist
from torch import nn
sys.path.insert(0, {tests!r})
from test_train import _tiny_model_and_batches, _ddp_groups
from nmt.batching import collate
from nmt.optim import build_optimizer
from nmt.step import make_scaler, update
dist.init_process_group("gloo")
rank = dist.get_rank()
cfg, model, rows, tgts = _tiny_model_and_batches()
net = nn.parallel.DistributedDataParallel(model)
batch = _ddp_groups(rows, tgts)[rank]
cpu = torch.device("cpu")
update(net, [batch], optimizer=build_optimizer(cfg.train, model.parameters()),
       scaler=make_scaler(cpu, "fp32"), device=cpu, precision="fp32", label_smoothing=0.1,
       clip_norm=1.0, world=2)
if rank == 0:
    torch.save(model.state_dict(), {out!r})
dist.destroy_process_group()
"""


def _ddp_groups(rows, tgts):
    """Two batches with very different token counts: 1 pair and 3 pairs."""
    return [collate(rows[:1], tgts[:1], [0]), collate(rows[1:], tgts[1:], [1, 2, 3])]


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
    cfg, model, rows, tgts = _tiny_model_and_batches()
    _step(model, cfg, _ddp_groups(rows, tgts))  # one process, both batches accumulated
    ddp = torch.load(out, weights_only=True)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ddp[k], v, rtol=1e-5, atol=1e-6)
