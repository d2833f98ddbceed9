"""OpenNMT-py 3.5.1, the baseline of every ratio: installed into its own virtual
environment (it pins torch<2.3 but runs on newer ones when installed --no-deps with the
packages it imports), trained with `onmt_train` on the reference model's settings, decoded
with `onmt_translate` from the last checkpoint written within the budget (its timed
decodings run later, in turns with the other rows': `peers.common.decode_in_turns`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
from pathlib import Path

import torch

from peers.common import (
    DECODINGS,
    TEST,
    Decoding,
    Result,
    Shared,
    bleu,
    depiece,
    ensure_venv,
    run,
    sh,
    train_peer,
)
from peers.previous import previous_result

KEYS = ("opennmt-py",)
NAME = "OpenNMT-py 3.5.1"
DEPS = [
    "configargparse",
    "tensorboard",
    "pyyaml",
    "sacrebleu",
    "sentencepiece",
    "six",
    "rapidfuzz",
    "pyonmttok>=1.37,<2",
    "spacy",
    "pyahocorasick",
    "fasttext-wheel",
]
# Each log line's step and target tokens/s (OpenNMT-py logs "src/tgt tok/s").
STEP = re.compile(r"Step (\d+)/.*?[\d.]+/\s*([\d.]+) tok/s")
TRANSLATION_TIME = re.compile(r"Total translation time \(s\): ([\d.]+)")
# In --work: its virtual environment, and its run's folder with every checkpoint it saved
VENV = "venv-onmt"
RUN_FOLDER = "onmt-run"
CHECKPOINTS = "model_step_*.pt"


def run_all(
    args: argparse.Namespace, shared: Shared, only: set[str]
) -> tuple[list[Result], list[Decoding]]:
    """Its row, trained (or the previous run's, `--redecode`), and its timed decodings."""
    if "opennmt-py" not in only:
        return [], []
    print(f"{'decoding' if args.again else 'training'} OpenNMT-py ...", flush=True)
    bin_dir = _install(args)
    home = args.work / RUN_FOLDER
    env = own_env()
    if args.again:
        result = previous_result(args, NAME)
    else:
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        result = _train(args, shared, home, bin_dir, env)
    # taking turns, when its running minutes ran out; else --minutes by the clock
    budget_end = result.budget_end or (result.started + args.minutes * 60 if args.minutes else 0)
    checkpoints = _within_budget(home, budget_end or float("inf"))
    if not checkpoints:
        result.note = "no checkpoint written within the budget: nothing decoded"
        return [result], []
    result.steps = checkpoint_step(checkpoints[-1])
    env = decoding_env(env)
    decodings = []
    for label, beam in DECODINGS:
        out = args.work / f"opennmt-py.{label}.hyp"
        cmd = translate_command(bin_dir, shared, checkpoints[-1], TEST, out, beam)
        hyps = functools.partial(depiece, out, shared.spm_model)
        decodings.append(Decoding(result, label, cmd, TRANSLATION_TIME, hyps, env))
    if args.curve:
        _curve(args, shared, result, checkpoints, bin_dir, env)
    short = args.updates and result.steps != args.updates
    why = f"not the {args.updates} asked for!" if short else "the last written within the budget"
    result.note = f"checkpoint at step {result.steps}, {why}"
    print(f"  {result.tokens_per_s:,.0f} tok/s", flush=True)
    return [result], decodings


def _install(args: argparse.Namespace) -> Path:
    """Its virtual environment (made once); the folder of its commands."""
    python = ensure_venv(
        args.work / VENV,
        [
            [f"torch=={torch.__version__.split('+')[0]}"],
            ["--no-deps", "OpenNMT-py==3.5.1"],
            DEPS,
        ],
    )
    return python.parent


def _config(args: argparse.Namespace, pieces: Path, home: Path) -> dict:
    """The reference model in OpenNMT-py's options. Every checkpoint is kept: the one the
    comparison decodes is the last written within the budget, and OpenNMT-py writes more
    after the SIGINT that ends it (up to the kill two minutes later), which with a short
    keep_checkpoint would delete it."""
    return {
        "save_data": str(home / "data"),
        "src_vocab": str(home / "vocab.shared"),
        "share_vocab": True,
        "src_vocab_size": 8000,
        "tgt_vocab_size": 8000,
        "data": {
            "corpus_1": {
                "path_src": str(pieces / "train.en"),
                "path_tgt": str(pieces / "train.fr"),
            },
            "valid": {"path_src": str(pieces / "val.en"), "path_tgt": str(pieces / "val.fr")},
        },
        "transforms": ["filtertoolong"],
        "src_seq_length": 100,
        "tgt_seq_length": 100,
        "save_model": str(home / "model"),
        "save_checkpoint_steps": 50 if args.curve else 100,
        "keep_checkpoint": -1,
        "seed": args.seed,
        "train_steps": args.updates or 1000000,  # it saves a checkpoint at its last step
        "valid_steps": 500 if args.curve else 1000000,
        "report_every": args.log_every,
        "model_type": "text",
        "encoder_type": "brnn",
        "decoder_type": "rnn",
        "rnn_type": "GRU",
        "enc_layers": 1,
        "dec_layers": 1,
        "hidden_size": 512,
        "word_vec_size": 256,
        "global_attention": "mlp",
        "input_feed": 1,
        "bridge": False,
        "share_decoder_embeddings": False,
        "optim": "adam",
        "learning_rate": 0.001,
        "max_grad_norm": 5,
        "dropout": [0.2],
        "label_smoothing": 0.0,
        "batch_size": 64,
        "batch_type": "sents",
        "normalization": "tokens",
        "accum_count": [1],
        "world_size": 1,
        "gpu_ranks": [],
        "num_workers": 0,
        **(args.decay.opennmt() if args.decay else {}),
        **({"average_decay": args.smoothing} if args.smoothing else {}),
    }


def _train(
    args: argparse.Namespace, shared: Shared, home: Path, bin_dir: Path, env: dict
) -> Result:
    cfg_path = home / "config.yaml"
    cfg_path.write_text(json.dumps(_config(args, shared.pieces, home), indent=1))  # JSON is YAML
    vocab = [str(bin_dir / "onmt_build_vocab"), "-config", str(cfg_path), "-n_sample", "-1"]
    # under --interleave it too takes turns: run beside a training, it would slow its windows
    run(vocab, log=home / "build_vocab.log", env=env, turns=args.turns)
    cmd = [str(bin_dir / "onmt_train"), "-config", str(cfg_path)]
    return train_peer(NAME, "opennmt-py", cmd, STEP, env, args)


def checkpoint_step(checkpoint: Path) -> int:
    """N of its model_step_N.pt."""
    return int(checkpoint.stem.split("_")[-1])


def _within_budget(home: Path, budget_end: float) -> list[Path]:
    """The checkpoints written before the budget ended, oldest first."""
    found = [c for c in home.glob(CHECKPOINTS) if c.stat().st_mtime <= budget_end]
    return sorted(found, key=checkpoint_step)


def own_env() -> dict[str, str]:
    """The environment its commands run in: as many threads as nmt's rows."""
    return {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}


def decoding_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for `onmt_translate`. OpenNMT-py pickles its options (argparse.Namespace) into
    checkpoints, which torch >= 2.6 refuses to load by default; these are files it wrote in
    a work folder of this script's."""
    return {**env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def translate_command(
    bin_dir: Path, shared: Shared, checkpoint: Path, split: str, out: Path, beam: int
) -> list[str]:
    """The command that decodes pieces/SPLIT.en into `out` (it reports its own time,
    `TRANSLATION_TIME`)."""
    return (
        [str(bin_dir / "onmt_translate"), "-model", str(checkpoint)]
        + ["-src", str(shared.pieces / f"{split}.en"), "-output", str(out)]
        + ["-beam_size", str(beam), "-batch_size", "64", "-batch_type", "sents"]
        + ["-max_length", "100", "-report_time"]
    )


def _curve(
    args: argparse.Namespace,
    shared: Shared,
    result: Result,
    checkpoints: list[Path],
    bin_dir: Path,
    env: dict,
) -> None:
    """Greedy validation BLEU every --curve steps and at the end, at the minute each
    checkpoint was written (the first checkpoint at or after each multiple of --curve, and
    the last)."""
    steps = [checkpoint_step(c) for c in checkpoints]
    picked = {
        next(c for c, n in zip(checkpoints, steps, strict=True) if n >= target)
        for target in range(args.curve, steps[-1] + 1, args.curve)
    } | {checkpoints[-1]}
    for checkpoint in sorted(picked, key=checkpoint_step):
        out = args.work / "opennmt-py.val.hyp"
        sh(translate_command(bin_dir, shared, checkpoint, "val", out, 1), env=env)
        result.curve.append(
            {
                "minutes": (checkpoint.stat().st_mtime - result.started) / 60,
                "step": checkpoint_step(checkpoint),
                "val_bleu": bleu(depiece(out, shared.spm_model), args.data, "val"),
            }
        )
