"""Shared fixtures: a small trained checkpoint built without train.py."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from nmt import signals
from nmt.batching import collate
from nmt.checkpoint import save_checkpoint
from nmt.config import DATA_DIR_ENV, Config, load_config
from nmt.model import build_model
from nmt.run_dir import RunFiles
from nmt.step import token_loss
from nmt.tokenizer import train_or_load

ROOT = Path(__file__).resolve().parents[1]
TINY_DATA = ROOT / "tests" / "data" / "tiny"
TINY_CONFIG = ROOT / "configs" / "tiny.yaml"
# --set a data root with nothing in it, and no download: what a data problem looks like
NO_DATA = ["--set", "data.root=/nonexistent-nmt-data", "--set", "data.download=none"]


# What the caller's environment may hold that changes what nmt does: the data root, full
# tracebacks instead of one-line errors, and torchrun's description of a process group
# (`nmt.runtime`). A suite run from a user's shell, or a GPU machine's check script, must
# not see them; a test that wants one sets it.
USERS_VARIABLES = (
    DATA_DIR_ENV,
    "NMT_DEBUG",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True, scope="session")
def _without_users_variables():
    """Before any other fixture (session-scoped ones too): the suite's processes and the
    commands they start run without USERS_VARIABLES."""
    with pytest.MonkeyPatch.context() as mp:
        for name in USERS_VARIABLES:
            mp.delenv(name, raising=False)
        yield


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_as_from_a_terminal() -> Iterator[None]:
    """The suite's process takes Ctrl-C as Python does in a terminal, also where the shell
    that started it had SIGINT ignored (`make test &` in a script, `nohup make test &`): the
    tests that press Ctrl-C, here or in the programs they start (which inherit an ignored
    signal but not a handler), then test what a user at a terminal gets, not the shell's
    choice. Before, seven of them failed in such a run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def _in_own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in its own empty folder: what nmt writes relative to the working
    directory (`runs/latest`, `runs/NAME`) never lands in the checkout the suite runs from,
    which may hold a user's own runs."""
    monkeypatch.chdir(tmp_path)


# The handlers a program installs for `signals.STOP` (scripts' mains, `nmt serve`, training's
# `StopSignals`) and processes inherit: one left in the suite's process by a test was inherited
# by the forked workers of the tests after it, and made one hang until CI's limit.


@pytest.fixture(autouse=True)
def _signal_handlers_put_back() -> Iterator[None]:
    """A test that leaves its own SIGINT or SIGTERM handler in the suite's process fails,
    and the suite's handlers are put back for the tests after it."""
    before = {sig: signal.getsignal(sig) for sig in signals.STOP}
    yield
    left = [
        signal.Signals(sig).name for sig in signals.STOP if signal.getsignal(sig) != before[sig]
    ]
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert not left, f"the test left a handler of its own for {' and '.join(left)}"


@dataclass(frozen=True)
class TinyRun:
    """A run directory holding `best.pt`: the tiny config's model, overfitted for a moment."""

    run_dir: Path
    checkpoint: Path
    config: Config
    train_src: list[str]
    train_tgt: list[str]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """Tokenizer trained on tests/data/tiny, model from configs/tiny.yaml, a few dozen Adam
    steps on the tiny corpus (a couple of seconds), saved as a checkpoint."""
    return _train_tiny(tmp_path_factory.mktemp("tiny_run"), [])


@pytest.fixture(scope="session")
def tiny_copy_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The same with copy attention (model.copy: true)."""
    return _train_tiny(tmp_path_factory.mktemp("tiny_copy_run"), ["model.copy=true"])


@pytest.fixture(scope="session")
def tiny_heads_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The same with two attention heads, local-p attention and copy attention."""
    keys = ["model.attention_heads=2", "model.attention_scope=local_p", "model.copy=true"]
    return _train_tiny(tmp_path_factory.mktemp("tiny_heads_run"), keys)


def _train_tiny(run_dir: Path, overrides: list[str]) -> TinyRun:
    cfg = load_config(TINY_CONFIG, [f"run.dir={run_dir}", f"data.dir={TINY_DATA}", *overrides])
    RunFiles(run_dir, keep_last=1).adopt()  # a run directory nmt made, as `nmt train`'s is
    src, tgt = _lines(TINY_DATA / "train.en"), _lines(TINY_DATA / "train.fr")
    tok = train_or_load(cfg.tokenizer, run_dir, src, tgt, log=lambda _: None)
    torch.manual_seed(cfg.train.seed)
    model = build_model(
        cfg.model,
        src_vocab_size=tok.src_vocab_size,
        tgt_vocab_size=tok.tgt_vocab_size,
        shared_vocab=tok.joint,
    )
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    batch = collate(tok.encode_src(src), tok.encode_tgt(tgt), range(len(src)))
    model.train()
    # On a shared, loaded CPU two threads spin against each other: ten times slower here.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(60):
            out = model(batch.src, batch.src_lens, batch.tgt_in)
            loss = token_loss(out, batch.tgt_out, 0.0) / batch.n_tgt_tokens
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    state = {
        "config": cfg.to_dict(),
        "tokenizer": tok.to_bytes(),
        "model": model.state_dict(),
        "step": 0,
    }
    save_checkpoint(state, run_dir / "best.pt")
    return TinyRun(
        run_dir=run_dir,
        checkpoint=run_dir / "best.pt",
        config=cfg,
        train_src=src,
        train_tgt=tgt,
    )
