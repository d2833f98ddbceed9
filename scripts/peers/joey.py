"""Joey NMT 2.3.0: installed into its own virtual environment, trained with `joeynmt train`
on the reference model's settings (Bahdanau attention, input feeding), decoded with
`joeynmt test` from its last checkpoint.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from nmt.files import read_lines
from peers.common import (
    DECODINGS,
    TEST,
    Decoding,
    Result,
    Shared,
    ensure_venv,
    train_peer,
)
from peers.previous import previous_result

KEYS = ("joeynmt",)
NAME = "Joey NMT 2.3.0"
GENERATION_TIME = re.compile(r"Generation took ([\d.]+)\[sec\]")
STEP = re.compile(r"Step:\s+(\d+),.*?Tokens per Sec:\s+([\d.]+)")


def run_all(
    args: argparse.Namespace, shared: Shared, only: set[str]
) -> tuple[list[Result], list[Decoding]]:
    """Its row, trained (or the previous run's, `--redecode`), and its timed decodings."""
    if "joeynmt" not in only:
        return [], []
    print(f"{'decoding' if args.redecode else 'training'} Joey NMT ...", flush=True)
    python = ensure_venv(
        args.work / "venv-joey",
        [
            [f"torch=={torch.__version__.split('+')[0]}"],
            ["joeynmt==2.3.0", "importlib-metadata", "sentencepiece==0.2.0"],
        ],
    )
    home = args.work / "joey-run"
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    config = _config(args, shared.spm_model, home)
    cfg_path = home / "config.yaml"
    if args.redecode:  # the previous run's model, decoded again
        result = previous_result(args, NAME)
    else:
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        cfg_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        cmd = [str(python), "-m", "joeynmt", "train", str(cfg_path)]
        result = train_peer(NAME, "joeynmt", cmd, STEP, env, args)
    checkpoints = sorted((home / "model").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not checkpoints:
        result.note = "no checkpoint written: nothing decoded"
        return [result], []
    decodings = []
    for label, beam in DECODINGS:
        config["testing"]["beam_size"] = beam
        config["testing"]["load_model"] = str(checkpoints[-1])
        label_cfg = home / f"config.{label}.yaml"  # one a decoding: they run in turns later
        label_cfg.write_text(json.dumps(config, indent=1))
        out = args.work / f"joeynmt.{label}"
        cmd = [str(python), "-m", "joeynmt", "test", str(label_cfg), "-o", str(out)]
        hyps = functools.partial(read_lines, Path(f"{out}.test"))
        decodings.append(Decoding(result, label, cmd, GENERATION_TIME, hyps, env))
    result.note = f"checkpoint {checkpoints[-1].name}"
    print(f"  {result.tokens_per_s:,.0f} tok/s", flush=True)
    return [result], decodings


def _config(args: argparse.Namespace, spm_model: Path, home: Path) -> dict[str, Any]:
    """The reference model in Joey NMT's options."""
    side = {
        "level": "bpe",
        "lowercase": False,
        "max_length": 100,
        "min_length": 1,
        "voc_limit": 8000,
        "voc_min_freq": 1,
        "tokenizer_type": "sentencepiece",
        "tokenizer_cfg": {"model_file": str(spm_model)},
    }
    return {
        "name": "reference_rnn",
        "joeynmt_version": "2.3.0",
        "data": {
            "train": str(args.data / "train"),
            "dev": str(args.data / "val"),
            "test": str(args.data / TEST),
            "dataset_type": "plain",
            "src": {"lang": "en", **side},
            "trg": {"lang": "fr", **side},
        },
        "testing": {
            "beam_size": 5,
            "beam_alpha": 0.0,
            "batch_size": 64,
            "batch_type": "sentence",
            "max_output_length": 100,
            "eval_metrics": ["bleu"],
            "sacrebleu_cfg": {"tokenize": "13a"},
        },
        "training": {
            "random_seed": args.seed,
            "optimizer": "adam",
            "learning_rate": 0.001,
            # Joey needs a schedule (its `plateau` passes an argument torch 2.13 no longer
            # takes, and `decaying` starts at a tenth of the rate): x1.0 an epoch is constant.
            "scheduling": "exponential",
            "decrease_factor": 1.0,
            "clip_grad_norm": 5.0,
            "batch_size": 64,
            "batch_type": "sentence",
            "epochs": 1000,
            "validation_freq": 1000000,
            "logging_freq": args.log_every,
            "early_stopping_metric": "bleu",
            "model_dir": str(home / "model"),
            "overwrite": True,
            "shuffle": True,
            "use_cuda": False,
            "print_valid_sents": [],
            "keep_best_ckpts": 1,
            "label_smoothing": 0.0,
            "normalization": "tokens",
        },
        "model": _model(),
    }


def _model() -> dict[str, Any]:
    """The reference model's architecture and initialisation in Joey NMT's options."""
    rnn = {"type": "recurrent", "rnn_type": "gru", "num_layers": 1, "dropout": 0.2}
    return {
        # the reference's U(-0.1, 0.1) for every parameter (OpenNMT-py's param_init 0.1);
        # Joey's own defaults (Xavier, zero biases) learned far less in the first hundreds
        # of updates (session 37)
        "initializer": "uniform",
        "init_weight": 0.1,
        "embed_initializer": "uniform",
        "embed_init_weight": 0.1,
        "bias_initializer": "uniform",
        "bias_init_weight": 0.1,
        "tied_embeddings": False,
        "tied_softmax": False,
        "encoder": {
            **rnn,
            "hidden_size": 256,
            "bidirectional": True,
            "embeddings": {"embedding_dim": 256},
        },
        "decoder": {
            **rnn,
            "hidden_size": 512,
            "hidden_dropout": 0.2,
            "input_feeding": True,
            "init_hidden": "last",
            "attention": "bahdanau",
            "embeddings": {"embedding_dim": 256},
        },
    }
