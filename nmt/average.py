"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one
run, written as a checkpoint that `nmt translate` and `nmt eval` load like any other.

Averaging the last few checkpoints of a run (Vaswani et al. 2017; Marian's `--exponential-
smoothing` and OpenNMT-py's `average_decay` are running versions of it) smooths out the
noise of the last updates, usually for a little BLEU. The checkpoints must come from one
model: the same model config and the same tokenizer; anything else is refused by name.

An averaged checkpoint holds what translating needs (config, tokenizer, vocabulary sizes,
weights) and the list it was averaged from; it has no optimizer state, so training cannot
resume from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from nmt.checkpoint import (
    CheckpointError,
    check_model_state,
    load_checkpoint,
    save_checkpoint,
)
from nmt.files import write_output
from nmt.run_dir import step_checkpoints


def last_checkpoints(run_dir: Path, n: int) -> list[Path]:
    """The `n` most recent step checkpoints of a run directory (there must be n)."""
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run directory")
    if n < 1:
        raise CheckpointError(f"--last {n}: expected at least 1")
    steps = step_checkpoints(run_dir)
    if len(steps) < n:
        raise CheckpointError(
            f"{run_dir}: {len(steps)} step checkpoint(s) (step-N.pt), cannot average the last "
            f"{n}; a run keeps train.keep_last of them"
        )
    return steps[-n:]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """The checkpoint whose weights are the mean of those in `paths` (float32 sums, then
    each tensor back in its own dtype); config and tokenizer from the first."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first_path = paths[0]
    first = _model_checkpoint(first_path)
    total = {k: v.double() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        state = _model_checkpoint(path)
        _check_same_model(first, first_path, state, path)
        for k, v in state["model"].items():
            if v.is_floating_point():
                total[k] += v.double()
            elif not torch.equal(total[k], v):
                raise CheckpointError(f"{path}: {k} differs from {first_path}'s; not one model")
    n = len(paths)
    model = {
        k: (v / n).to(first["model"][k].dtype) if v.is_floating_point() else v
        for k, v in total.items()
    }
    out = {
        "config": first["config"],
        "tokenizer": first["tokenizer"],
        "vocab": first.get("vocab"),
        "model": model,
        "averaged_from": [str(p) for p in paths],
    }
    if "shortlist" in first:  # built from the training data: the same in every checkpoint
        out["shortlist"] = first["shortlist"]
    return out


def _model_checkpoint(path: Path) -> dict[str, Any]:
    state = load_checkpoint(path)
    check_model_state(state, path)
    return state


def _check_same_model(
    first: dict[str, Any], first_path: Path, other: dict[str, Any], path: Path
) -> None:
    if other["config"].get("model") != first["config"].get("model"):
        raise CheckpointError(f"{path}: a different model config from {first_path}'s")
    if other["tokenizer"] != first["tokenizer"]:
        raise CheckpointError(f"{path}: a different tokenizer from {first_path}'s")
    if other["model"].keys() != first["model"].keys() or any(
        other["model"][k].shape != v.shape for k, v in first["model"].items()
    ):
        raise CheckpointError(f"{path}: different weights (names or shapes) from {first_path}'s")


def write_average(paths: list[Path], out: Path) -> dict[str, Any]:
    """Average `paths` and write the result to `out` atomically; returns what was written."""
    averaged = average_checkpoints(paths)
    save_checkpoint(averaged, out, write=write_output)  # a file the user named
    return averaged
