"""nmt against OpenNMT-py and Joey NMT: the same model, data and machine, in one run.

Each toolkit trains the reference model (configs/reference_rnn.yaml: embeddings 256, a
bidirectional GRU 256 per direction, an input-feeding GRU decoder 512 with mlp/concat
attention, an untied 512 x 8,000 output layer, 64 sentences a batch, Adam 1e-3, clip 5,
dropout 0.2) for the same number of minutes on Multi30k en->fr, one after the other, all on
one joint sentencepiece model (nmt's, trained once by `nmt prepare`). Then each decodes
test_2016_flickr greedily and with beam 5 from its last checkpoint. One table, with ratios
to OpenNMT-py, is printed and written as JSON.

    .venv/bin/python scripts/compare_peers.py --minutes 4 --data ../shared/data/multi30k

Learning curves (BLEU against minutes): `--curve N` has nmt validate every N updates (its
greedy validation BLEU, the minutes it was reached at, validation time included as in any
nmt run) and OpenNMT-py save a checkpoint every N steps (validating every 500 as usual),
each decoded greedily on the validation set afterwards. `--plot FILE.png` draws them;
`--nmt-config` trains another nmt config than the reference model (the peers keep theirs):

    .venv/bin/python scripts/compare_peers.py --minutes 15 --only nmt-fp32,opennmt-py \
        --nmt-config configs/multi30k_en_fr.yaml --curve 250 --plot docs/curve.png

Training speed is target tokens/s (non-pad, EOS included) as each toolkit logs it per log
window, the median of the windows after the first (which holds start-up). Peak memory is the
training process's peak resident set (`wait4`). Decoding times are the toolkits' own
translation time (model loading excluded) and the whole command's. BLEU is sacrebleu's on
detokenized (sentencepiece-decoded) output against the raw references.

The peers are installed, once, into their own virtual environments under --work (default
~/.cache/nmt-peers, outside the repository), with the torch of this environment's version:
OpenNMT-py 3.5.1 pins torch<2.3 but runs on newer ones when installed --no-deps with the
packages it imports. Nothing else runs meanwhile: two jobs on a small machine make both
figures wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sentencepiece as spm
import torch

from nmt import evaluate
from nmt.display import save_figure
from nmt.runtime import cpu_has_bf16_matmul

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "reference_rnn.yaml"
TEST = "test_2016_flickr"
ONMT_DEPS = [
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


@dataclass
class Result:
    """One toolkit's (or one nmt precision's) figures."""

    name: str
    tokens_per_s: float = 0.0
    windows: list[float] = field(default_factory=list)
    peak_rss_gb: float = 0.0
    steps: int = 0
    decode: dict[str, dict[str, float]] = field(default_factory=dict)  # greedy/beam5 -> figures
    note: str = ""
    started: float = 0.0  # time.time() when its training command started
    curve: list[dict[str, float]] = field(default_factory=list)  # minutes, step, val_bleu


def run(cmd: list[str], *, log: Path, env: dict[str, str] | None = None, minutes: float = 0) -> int:
    """Run `cmd` with its output in `log`, interrupted (SIGINT, as Ctrl-C) after `minutes`
    (0: until it ends) and killed 2 minutes later if still there. Returns the peak resident
    set in bytes of the process (and of its children it waited for)."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        start = time.monotonic()
        interrupted_at = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            now = time.monotonic()
            if minutes and interrupted_at is None and now - start > minutes * 60:
                os.killpg(proc.pid, signal.SIGINT)
                interrupted_at = now
            elif interrupted_at is not None and now - interrupted_at > 120:
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.5)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 and interrupted_at is None:
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}); {log}:\n{tail}")
    return usage.ru_maxrss * 1024


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run `cmd` to its end; on failure, stop with the end of what it printed."""
    proc = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))} ... failed ({proc.returncode}):\n{tail}")
    return proc


def ensure_venv(path: Path, steps: list[list[str]]) -> Path:
    """A virtualenv at `path` with `steps` (pip argument lists) installed; its python."""
    python = path / "bin" / "python"
    if (path / ".installed").is_file():
        return python
    sh([sys.executable, "-m", "venv", str(path)])
    sh([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    for args in steps:
        print(f"  pip install {' '.join(args)}", flush=True)
        sh([str(python), "-m", "pip", "install", "--quiet", *args])
    (path / ".installed").write_text("ok\n")
    return python


def median_after_first(windows: list[float]) -> float:
    rest = windows[1:] or windows
    return statistics.median(rest) if rest else 0.0


def train_peer(
    name: str, tag: str, cmd: list[str], pattern: re.Pattern, env: dict, args: argparse.Namespace
) -> Result:
    """Train a peer for --minutes; its speed read from its log (`pattern`: step, tokens/s)."""
    log = args.work / f"{tag}.train.log"
    started = time.time()
    rss = run(cmd, log=log, env=env, minutes=args.minutes)
    found = [(int(m.group(1)), float(m.group(2))) for m in pattern.finditer(log.read_text())]
    windows = [tok for _, tok in found]
    steps = found[-1][0] if found else 0
    return Result(name, median_after_first(windows), windows, rss / 2**30, steps, started=started)


# --- data -----------------------------------------------------------------------------


def encode_pieces(model: Path, data: Path, out: Path) -> None:
    """train/val/test sides as sentencepiece pieces, one sentence a line, for the peers."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", TEST):
        for lang in ("en", "fr"):
            lines = (data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            pieces = sp.encode([line.strip() for line in lines], out_type=str)
            (out / f"{split}.{lang}").write_text(
                "".join(" ".join(p) + "\n" for p in pieces), encoding="utf-8"
            )


def bleu(hyps: list[str], data: Path, split: str = TEST) -> float:
    """sacreBLEU's default BLEU, as `nmt eval --bleu` computes it."""
    refs = (data / f"{split}.fr").read_text(encoding="utf-8").splitlines()
    return evaluate.bleu(hyps, refs).score


def scores(hyps: list[str], data: Path) -> dict[str, float]:
    """Test BLEU, cased sacreBLEU and under the Multi30k shared-task protocol (wmt-mmt)."""
    refs = (data / f"{TEST}.fr").read_text(encoding="utf-8").splitlines()
    mmt = evaluate.bleu(hyps, refs, protocol="wmt-mmt", lang="fr").score
    return {"bleu": bleu(hyps, data), "bleu_wmt_mmt": mmt}


def depiece(path: Path, model: Path) -> list[str]:
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.decode(line.split()) for line in path.read_text(encoding="utf-8").splitlines()]


# --- nmt ------------------------------------------------------------------------------


def nmt_train(name: str, precision: str, args: argparse.Namespace, run_dir: Path) -> Result:
    nmt = [sys.executable, "-m", "nmt"]
    sets = [
        f"data.dir={args.data}",
        f"run.dir={run_dir}",
        f"train.precision={precision}",
        f"train.max_minutes={args.minutes}",
        "train.max_epochs=0",
        f"train.log_every={args.log_every}",
        # no validation inside the timed run, unless a learning curve is wanted
        f"train.valid_every={args.curve or 1000000}",
        "run.tensorboard=false",
        *args.nmt_set,
    ]
    config = args.nmt_config
    cmd = [*nmt, "train", str(config), "--overwrite"] + [a for s in sets for a in ("--set", s)]
    log = args.work / f"{name}.train.log"
    rss = run(cmd, log=log)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    steps = max((r["step"] for r in rows if "step" in r), default=0)
    curve = [
        {"minutes": r["minutes"], "step": r["step"], "val_bleu": r["val_bleu"]}
        for r in rows
        if "val_bleu" in r
    ]
    return Result(name, median_after_first(windows), windows, rss / 2**30, steps, curve=curve)


NMT_DECODE = """
import json, sys, time
from nmt.translate import Translator
model, src, out, beam, precision = sys.argv[1:6]
tr = Translator.from_checkpoint(model, "auto", precision=precision)
lines = open(src, encoding="utf-8").read().splitlines()
start = time.perf_counter()
hyps = tr.translate(lines, beam=int(beam), batch_size=64)
seconds = time.perf_counter() - start
open(out, "w", encoding="utf-8").write("".join(h.text + "\\n" for h in hyps))
print(json.dumps({"seconds": seconds}))
"""


def nmt_decode(result: Result, run_dir: Path, precision: str, args: argparse.Namespace) -> None:
    for label, beam in (("greedy", 1), ("beam5", 5)):
        out = args.work / f"{result.name}.{label}.hyp"
        start = time.perf_counter()
        proc = sh(
            [
                sys.executable,
                "-c",
                NMT_DECODE,
                # the timed speed run decodes where it stopped; a curve run (validating as
                # nmt does) decodes what nmt would translate with (averaged, else best)
                str(run_dir if args.curve else run_dir / "last.pt"),
                str(args.data / f"{TEST}.en"),
                str(out),
                str(beam),
                precision,
            ]
        )
        whole = time.perf_counter() - start
        inside = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
        hyps = out.read_text(encoding="utf-8").splitlines()
        result.decode[label] = {"seconds": inside, "command_s": whole, **scores(hyps, args.data)}


# --- OpenNMT-py -----------------------------------------------------------------------

# Each log line's step and target tokens/s (OpenNMT-py logs "src/tgt tok/s").
ONMT_STEP = re.compile(r"Step (\d+)/.*?[\d.]+/\s*([\d.]+) tok/s")


def onmt(args: argparse.Namespace, pieces: Path, spm_model: Path) -> Result:
    venv = ensure_venv(
        args.work / "venv-onmt",
        [
            [f"torch=={torch.__version__.split('+')[0]}"],
            ["--no-deps", "OpenNMT-py==3.5.1"],
            ONMT_DEPS,
        ],
    )
    bin_dir = venv.parent
    home = args.work / "onmt-run"
    previous = previous_result(args, "OpenNMT-py 3.5.1") if args.redecode_onmt else None
    if previous is None:
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
    config = {
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
        "keep_checkpoint": -1 if args.curve else 2,
        "seed": 1,
        "train_steps": 1000000,
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
    }
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    if previous is None:
        cfg_path = home / "config.yaml"
        cfg_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        sh([str(bin_dir / "onmt_build_vocab"), "-config", str(cfg_path), "-n_sample", "-1"])
        cmd = [str(bin_dir / "onmt_train"), "-config", str(cfg_path)]
        result = train_peer("OpenNMT-py 3.5.1", "opennmt-py", cmd, ONMT_STEP, env, args)
    else:
        result = previous
        result.decode, result.curve = {}, []
    # OpenNMT-py finishes more steps after the SIGINT that ends its budget (up to the kill two
    # minutes later): only checkpoints written within --minutes count.
    budget_end = result.started + args.minutes * 60
    checkpoints = sorted(
        (c for c in home.glob("model_step_*.pt") if c.stat().st_mtime <= budget_end),
        key=lambda p: int(p.stem.split("_")[-1]),
    )
    if not checkpoints:
        result.note = "no checkpoint written within the budget"
        return result
    result.steps = int(checkpoints[-1].stem.split("_")[-1])
    # OpenNMT-py pickles its options (argparse.Namespace) into checkpoints, which torch >= 2.6
    # refuses to load by default; these are files it just wrote.
    env = {**env, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}

    def translate(checkpoint: Path, split: str, out: Path, beam: int) -> tuple[float, float]:
        """Decode pieces/SPLIT.en; its own translation time and the whole command's."""
        start = time.perf_counter()
        proc = sh(
            [str(bin_dir / "onmt_translate"), "-model", str(checkpoint)]
            + ["-src", str(pieces / f"{split}.en"), "-output", str(out)]
            + ["-beam_size", str(beam), "-batch_size", "64", "-batch_type", "sents"]
            + ["-max_length", "100", "-report_time"],
            env=env,
        )
        whole = time.perf_counter() - start
        found = re.search(r"Total translation time \(s\): ([\d.]+)", proc.stdout + proc.stderr)
        return (float(found.group(1)) if found else whole), whole

    for label, beam in (("greedy", 1), ("beam5", 5)):
        out = args.work / f"opennmt-py.{label}.hyp"
        seconds, whole = translate(checkpoints[-1], TEST, out, beam)
        hyps = depiece(out, spm_model)
        result.decode[label] = {"seconds": seconds, "command_s": whole, **scores(hyps, args.data)}
    if args.curve:  # greedy validation BLEU every --curve steps and at the end, at the minute
        # each checkpoint was written
        # (the first checkpoint at or after each multiple of --curve, and the last)
        steps = [int(c.stem.split("_")[-1]) for c in checkpoints]
        picked = {
            next(c for c, n in zip(checkpoints, steps, strict=True) if n >= target)
            for target in range(args.curve, steps[-1] + 1, args.curve)
        } | {checkpoints[-1]}
        for checkpoint in sorted(picked, key=lambda c: int(c.stem.split("_")[-1])):
            out = args.work / "opennmt-py.val.hyp"
            translate(checkpoint, "val", out, 1)
            result.curve.append(
                {
                    "minutes": (checkpoint.stat().st_mtime - result.started) / 60,
                    "step": int(checkpoint.stem.split("_")[-1]),
                    "val_bleu": bleu(depiece(out, spm_model), args.data, "val"),
                }
            )
    result.note = f"checkpoint at step {result.steps}, the last written within the budget"
    return result


# --- Joey NMT -------------------------------------------------------------------------

JOEY_STEP = re.compile(r"Step:\s+(\d+),.*?Tokens per Sec:\s+([\d.]+)")


def joey(args: argparse.Namespace, spm_model: Path) -> Result:
    python = ensure_venv(
        args.work / "venv-joey",
        [
            [f"torch=={torch.__version__.split('+')[0]}"],
            ["joeynmt==2.3.0", "importlib-metadata", "sentencepiece==0.2.0"],
        ],
    )
    home = args.work / "joey-run"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
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
    rnn = {"type": "recurrent", "rnn_type": "gru", "num_layers": 1, "dropout": 0.2}
    config = {
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
            "random_seed": 1,
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
        "model": {
            "initializer": "xavier_uniform",
            "bias_initializer": "zeros",
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
        },
    }
    cfg_path = home / "config.yaml"
    cfg_path.write_text(json.dumps(config, indent=1))
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    cmd = [str(python), "-m", "joeynmt", "train", str(cfg_path)]
    result = train_peer("Joey NMT 2.3.0", "joeynmt", cmd, JOEY_STEP, env, args)
    checkpoints = sorted((home / "model").glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    if not checkpoints:
        result.note = "no checkpoint written"
        return result
    for label, beam in (("greedy", 1), ("beam5", 5)):
        config["testing"]["beam_size"] = beam
        config["testing"]["load_model"] = str(checkpoints[-1])
        cfg_path.write_text(json.dumps(config, indent=1))
        out = args.work / f"joeynmt.{label}"
        start = time.perf_counter()
        proc = sh(
            [
                str(python),
                "-m",
                "joeynmt",
                "test",
                str(cfg_path),
                "-o",
                str(out),
            ],
            env=env,
        )
        whole = time.perf_counter() - start
        took = re.findall(r"Generation took ([\d.]+)\[sec\]", proc.stdout + proc.stderr)
        hyps = Path(f"{out}.test").read_text(encoding="utf-8").splitlines()
        result.decode[label] = {
            "seconds": float(took[-1]) if took else whole,
            "command_s": whole,
            **scores(hyps, args.data),
        }
    result.note = f"checkpoint {checkpoints[-1].name}"
    return result


# --- the table ------------------------------------------------------------------------


def table(results: list[Result], base: Result | None) -> str:
    def ratio(value: float, ref: float | None, inverse: bool = False) -> str:
        if not ref or not value:
            return ""
        r = ref / value if inverse else value / ref
        return f" ({r:.2f}x)"

    lines = [
        "| | target tokens/s (x OpenNMT-py) | peak RSS GB | steps | greedy s (x) | greedy BLEU "
        "| beam 5 s (x) | beam 5 BLEU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [
            r.name,
            f"{r.tokens_per_s:,.0f}" + ratio(r.tokens_per_s, base and base.tokens_per_s),
        ]
        cells += [f"{r.peak_rss_gb:.2f}", str(r.steps)]
        for label in ("greedy", "beam5"):
            d = r.decode.get(label)
            ref = base.decode.get(label) if base else None
            if d:
                cells.append(
                    f"{d['seconds']:.1f}"
                    + ratio(d["seconds"], ref and ref["seconds"], inverse=True)
                )
                cells.append(f"{d['bleu']:.1f}")
            else:
                cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def previous_result(args: argparse.Namespace, name: str) -> Result | None:
    """`name`'s training figures from --out's previous run (for --redecode-onmt)."""
    if not args.out.is_file():
        raise SystemExit(f"--redecode-onmt: no previous run in {args.out}")
    for r in json.loads(args.out.read_text())["results"]:
        if r["name"] == name:
            return Result(**r)
    raise SystemExit(f"--redecode-onmt: {args.out} holds no {name} run")


def plot(results: list[Result], path: Path, minutes: float) -> None:
    """Validation BLEU (greedy) against training minutes, every toolkit on the same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for r in results:
        if r.curve:
            ax.plot(
                [p["minutes"] for p in r.curve],
                [p["val_bleu"] for p in r.curve],
                marker="o",
                label=r.name,
            )
    ax.set_xlabel("training minutes (this machine)")
    ax.set_ylabel("val BLEU, greedy (sacreBLEU)")
    ax.set_xlim(0, minutes * 1.05)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=4.0, help="training time of each")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "nmt-peers")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "compare_peers.json")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--nmt-config", type=Path, default=CONFIG, help="the config nmt trains")
    ap.add_argument(
        "--nmt-set", action="append", default=[], metavar="KEY=VALUE", help="nmt override"
    )
    ap.add_argument("--curve", type=int, default=0, help="learning curve: a point every N updates")
    ap.add_argument("--plot", type=Path, help="draw the learning curves to FILE.png")
    ap.add_argument(
        "--redecode-onmt",
        action="store_true",
        help="decode OpenNMT-py's checkpoints of the previous run again (no training); the "
        "other rows are kept from --out",
    )
    ap.add_argument(
        "--only",
        default="nmt-fp32,nmt-bf16,nmt-fp16,opennmt-py,joeynmt",
        help="comma-separated: nmt-fp32, nmt-bf16, nmt-fp16 (GPU), opennmt-py, joeynmt",
    )
    args = ap.parse_args()
    args.data, args.work = args.data.resolve(), args.work.resolve()
    if not (args.data / "train.en").is_file():
        raise SystemExit(f"--data {args.data}: no train.en there; expected Multi30k's files")
    args.work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    threads = torch.get_num_threads()
    print(
        f"{threads} threads, torch {torch.__version__}, {args.minutes} min each; "
        f"work in {args.work}"
    )

    # One sentencepiece model for all: nmt's tokenizer, trained once.
    spm_run = args.work / "spm-run"
    sh(
        [
            sys.executable,
            "-m",
            "nmt",
            "prepare",
            str(CONFIG),
            "--set",
            f"data.dir={args.data}",
            "--set",
            f"run.dir={spm_run}",
        ]
    )
    spm_model = spm_run / "spm.model"
    pieces = args.work / "pieces"
    encode_pieces(spm_model, args.data, pieces)

    results: list[Result] = []
    gpu = torch.cuda.is_available()  # nmt trains and decodes there (device auto)
    for precision in ("fp32", "bf16", "fp16") if gpu else ("fp32", "bf16"):
        name = f"nmt-{precision}"
        if name not in only:
            continue
        if precision == "bf16" and not gpu and not cpu_has_bf16_matmul():
            print(
                "nmt bf16: skipped: this CPU has no bf16 matrix units (AVX512-BF16 or AMX), "
                "so bf16 products are emulated, 1-2 GFLOP/s against fp32's ~100"
            )
            continue
        print(f"training {name} ...", flush=True)
        run_dir = args.work / name
        r = nmt_train(f"nmt {precision}", precision, args, run_dir)
        same = (run_dir / "spm.model").read_bytes() == spm_model.read_bytes()
        r.note = "same sentencepiece model" if same else "sentencepiece model differs!"
        nmt_decode(r, run_dir, precision, args)
        results.append(r)
        print(f"  {r.tokens_per_s:,.0f} tok/s, {r.decode}", flush=True)
    base = None
    if "opennmt-py" in only:
        print("training OpenNMT-py ...", flush=True)
        base = onmt(args, pieces, spm_model)
        results.insert(0, base)
        print(f"  {base.tokens_per_s:,.0f} tok/s, {base.decode}", flush=True)
    if "joeynmt" in only:
        print("training Joey NMT ...", flush=True)
        r = joey(args, spm_model)
        results.insert(1 if base else 0, r)
        print(f"  {r.tokens_per_s:,.0f} tok/s, {r.decode}", flush=True)

    if args.redecode_onmt:  # the rows not run again, as the previous run left them
        kept = json.loads(args.out.read_text())["results"]
        results += [Result(**r) for r in kept if r["name"] not in {x.name for x in results}]
    print()
    print(table(results, base))
    for r in results:
        for label, d in r.decode.items():
            print(f"{r.name} {label}: test BLEU {d['bleu']:.1f}, wmt-mmt {d['bleu_wmt_mmt']:.1f}")
    if args.plot:
        plot(results, args.plot, args.minutes)
        print(f"curve: {args.plot}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "threads": threads,
                "torch": torch.__version__,
                "minutes": args.minutes,
                "nmt_config": str(args.nmt_config),
                "nmt_set": args.nmt_set,
                "results": [asdict(r) for r in results],
            },
            indent=1,
        )
    )
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
