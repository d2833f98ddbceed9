"""The attention study: the four scoring functions (dot, scaled dot, bilinear, concat) under
the Bahdanau decoder and the Luong decoder with and without input feeding, everything else
as configs/multi30k_en_fr.yaml says, the same number of updates, data and seeds.

    .venv/bin/python scripts/attention_study.py --steps 400 --seeds 1
    .venv/bin/python scripts/attention_study.py --steps 400 --seeds 1 2   # adds seed 2
    .venv/bin/python scripts/attention_study.py --steps 1000 --only luong.dot luong.bilinear \
        --copy                     # the best cells with copy attention off and on
    .venv/bin/python scripts/attention_study.py --steps 1000 --variants global local_m \
        local_p heads2 heads4 heads8 --only luong.bilinear luong.dot.global luong.dot.local_m \
        luong.dot.local_p          # the rest of the family: local with the two best scorers,
                                   # 1, 2, 4 and 8 heads with the best

Resumable: a finished cell (its JSON in WORK/cells/) is not run again, so a second call
with more seeds trains only the new cells. Per cell:
- training: `nmt train` with the cell's settings for --steps updates (validation at the
  end only), its median training tokens/s;
- validation BLEU (greedy, as in training) of the final model; test_2016_flickr BLEU
  (beam 5, cased sacreBLEU) and decoding speed (sentences/s, beam 5);
- the attention over the reference translations of the test set (teacher forcing): mean
  entropy, mean share of the most-attended source token, and how well its strongest source
  word per target word agrees with eflomal (a statistical word aligner, run once on the
  training corpus plus the test set): precision, recall and AER at word level, with
  eflomal's intersection of both directions as sure links and their union as possible;
- the share of names copied exactly in docs/names.tsv's sentences (names no training corpus
  holds: `scripts/names_set.py`), greedy.
- with several attention heads, the alignment scores of each head alone.
With --copy, every cell is run twice, copy attention off and on (`model.copy`). With
--variants, once per variant of the attention family (`VARIANTS`: global, Luong's local-m
and local-p, 2/4/8 heads). Then one table (markdown, also in --out as JSON) and one figure
(--figure): the attention of the same test sentence under every cell of seed 1, side by
side.

eflomal is not one of nmt's dependencies: `pip install eflomal` (builds with gcc).
Run nothing else meanwhile: the speeds are wall-clock measurements on a shared CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from peers.common import run  # noqa: E402

from nmt.alignment import (  # noqa: E402
    alignment_scores,
    sharpness,
    strongest_links,
    word_attention,
)
from nmt.batching import collate  # noqa: E402
from nmt.display import save_figure  # noqa: E402
from nmt.errors import one_line  # noqa: E402
from nmt.evaluate import bleu  # noqa: E402
from nmt.files import check_output, write_output  # noqa: E402
from nmt.files import read_lines as lines  # noqa: E402
from nmt.model import Seq2Seq  # noqa: E402
from nmt.report import read_metrics  # noqa: E402
from nmt.run_dir import OWNER_MARK  # noqa: E402
from nmt.tokenizer import EOS_PIECE  # noqa: E402
from nmt.translate import Translator  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from argtypes import whole  # noqa: E402
from names_set import names_copied  # noqa: E402
from reference_alignment import eflomal_links  # noqa: E402
from work_folder import WorkFolder  # noqa: E402

CONFIG = ROOT / "configs" / "multi30k_en_fr.yaml"  # --config: another base (e.g. tiny, to try)
TEST = "test_2016_flickr"
# --work: the script deletes a cell's run cut short and starts it again, so only in a folder
# of its own (an earlier version's holds its cells' results or its pieces)
WORK = WorkFolder(
    "scripts/attention_study.py",
    mark=".attention-study-work",
    remakes="runs/CELL for a cell cut short",
    earlier=("cells", f"spm-run/{OWNER_MARK}"),
)
SCORERS = ("dot", "scaled_dot", "bilinear", "concat")
DECODERS = {  # name -> config overrides
    "bahdanau": ["model.decoder=bahdanau", "model.input_feeding=false"],
    "luong": ["model.decoder=luong", "model.input_feeding=false"],
    "luong+feed": ["model.decoder=luong", "model.input_feeding=true"],
}
VARIANTS = {  # the attention family: name -> config overrides (global: the config's own)
    "global": [],
    "local_m": ["model.attention_scope=local_m"],
    "local_p": ["model.attention_scope=local_p"],
    **{f"heads{h}": [f"model.attention_heads={h}"] for h in (2, 4, 8)},
}


# --------------------------------------------------------------------------- one cell


def cell_name(
    decoder: str, scorer: str, seed: int, steps: int, copy: bool = False, variant: str = "global"
) -> str:
    kind = "" if variant == "global" else f".{variant}"  # global cells keep their first names
    return f"{decoder}.{scorer}{kind}{'.copy' if copy else ''}.seed{seed}.steps{steps}"


def shared_tokenizer(args: argparse.Namespace) -> Path:
    """The tokenizer and tokenized data, prepared once and copied into every cell's run."""
    spm_run = args.work / "spm-run"
    if not (spm_run / "spm.model").is_file():
        run(
            [
                sys.executable,
                "-m",
                "nmt",
                "prepare",
                str(args.config),
                "--set",
                f"data.dir={args.data}",
            ]
            + ["--set", f"run.dir={spm_run}"],
            log=args.work / "prepare.log",
        )
    return spm_run


def train_cell(
    args: argparse.Namespace,
    decoder: str,
    scorer: str,
    seed: int,
    run_dir: Path,
    copy: bool,
    variant: str = "global",
):
    spm_run = shared_tokenizer(args)
    if run_dir.exists():  # a cell cut short: start it again
        shutil.rmtree(run_dir)
    # a copy of the prepared run (tokenizer, cached data, the mark that nmt made it)
    shutil.copytree(spm_run, run_dir)
    sets = [
        f"data.dir={args.data}",
        f"run.dir={run_dir}",
        f"model.attention={scorer}",
        *DECODERS[decoder],
        *VARIANTS[variant],
        f"model.copy={str(copy).lower()}",
        f"train.seed={seed}",
        f"train.max_steps={args.steps}",
        "train.max_epochs=0",
        f"train.valid_every={args.steps}",
        "train.patience=0",
        "train.log_every=50",
        "run.tensorboard=false",
        "run.link_latest=false",  # the user's runs/latest stays on the user's own model
    ]
    cmd = [sys.executable, "-m", "nmt", "train", str(args.config)]
    run(cmd + [a for s in sets for a in ("--set", s)], log=run_dir / "train.log")


@torch.inference_mode()
def forced_attention(
    tr: Translator, sources: list[str], refs: list[str]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(T, S) attention of each sentence over its reference (teacher forcing), EOS included,
    and each head's, (H, T, S)."""
    tok, model = tr.tokenizer, tr.model
    assert isinstance(model, Seq2Seq)
    src_ids, tgt_ids = tok.encode_src(sources), tok.encode_tgt(refs)
    out: list[torch.Tensor] = [torch.zeros(0)] * len(sources)
    heads: list[torch.Tensor] = [torch.zeros(0)] * len(sources)
    for i in range(0, len(sources), 64):
        rows = list(range(i, min(i + 64, len(sources))))
        batch = collate([src_ids[r] for r in rows], [tgt_ids[r] for r in rows], rows)
        found = model(batch.src, batch.src_lens, batch.tgt_in, heads=True)
        assert found.heads is not None
        for b, r in enumerate(batch.index.tolist()):  # collate sorts by source length
            t, s = len(tgt_ids[r]) + 1, len(src_ids[r]) + 1
            out[r] = found.attention[b, :t, :s].float()  # (T, S)
            heads[r] = found.heads[b, :, :t, :s].float()  # (H, T, S)
    return out, heads


def alignment_of(
    tr: Translator, sources: list[str], refs: list[str], attn: list[torch.Tensor], sure, possible
):
    """Word alignment scores of `attn` ((T, S) per sentence) against eflomal's links."""
    tok = tr.tokenizer
    predicted, kept = [], []
    for i, (s, r, a) in enumerate(zip(sources, refs, attn, strict=True)):
        src_pieces = tok.src_pieces(s) + [EOS_PIECE]
        tgt_pieces = tok.tgt_pieces(tok.encode_tgt([r])[0]) + [EOS_PIECE]
        words = word_attention(a, src_pieces, tgt_pieces)
        if words.shape != (len(r.split()), len(s.split())):
            continue  # pieces and whitespace words disagree (rare normalisation cases)
        predicted.append(strongest_links(words))
        kept.append(i)
    return alignment_scores(predicted, [sure[i] for i in kept], [possible[i] for i in kept])


def evaluate_cell(
    args: argparse.Namespace, run_dir: Path, sure: list[set], possible: list[set]
) -> dict:
    rows = read_metrics(run_dir)
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][1:]  # the first warms up
    val = [r for r in rows if "val_bleu" in r][-1]
    tr = Translator.from_checkpoint(run_dir / "last.pt", log=lambda _: None)
    sources, refs = lines(args.data / f"{TEST}.en"), lines(args.data / f"{TEST}.fr")
    start = time.perf_counter()
    hyps = tr.translate(sources, beam=5)
    seconds = time.perf_counter() - start
    attn, heads = forced_attention(tr, sources, refs)
    align = alignment_of(tr, sources, refs, attn, sure, possible)
    per_head = []
    if heads[0].size(0) > 1:  # each head alone: does one of them align best?
        for h in range(heads[0].size(0)):
            one = alignment_of(tr, sources, refs, [x[h] for x in heads], sure, possible)
            per_head.append({"precision": one.precision, "recall": one.recall, "aer": one.aer})
    sharp = sharpness(attn)
    names = names_copied(tr, ROOT / "docs" / "names.tsv", beam=1)
    k = args.sentence
    return {
        "steps": val["step"],
        "train_tokens_per_s": statistics.median(speeds) if speeds else 0.0,
        "val_bleu_greedy": val["val_bleu"],
        "test_bleu_beam5": bleu([h.text for h in hyps], refs).score,
        "decode_sentences_per_s": len(sources) / seconds,
        "attention_entropy": sharp.entropy,
        "uniform_entropy": sharp.uniform_entropy,
        "max_share": sharp.max_share,
        "align_precision": align.precision,
        "align_recall": align.recall,
        "aer": align.aer,
        "aligned_sentences": align.sentences,
        "names_copied": names,
        "heads": per_head,
        "example": {
            "source": hyps[k].src_tokens,
            "target": hyps[k].tgt_labels,
            "text": hyps[k].text,
            "attention": hyps[k].attention.tolist(),
        },
    }


# --------------------------------------------------------------------------- report


def mean_spread(values: list[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    half = (max(values) - min(values)) / 2
    return f"{statistics.mean(values):.{digits}f} ± {half:.{digits}f}"


def table(cells: dict[str, dict], seeds: list[int], steps: int) -> str:
    head = (
        "| decoder | attention | variant | copy | val BLEU (greedy) | test BLEU (beam 5) "
        "| train tok/s | decode sent/s | entropy (flat) | top share | align P / R | AER "
        "| best head's AER | names copied |"
    )
    out = [head, "|" + "---|" * 14]
    for decoder, scorer, variant, copy in itertools.product(
        DECODERS, SCORERS, VARIANTS, (False, True)
    ):
        names = [cell_name(decoder, scorer, s, steps, copy, variant) for s in seeds]
        got = [cells[c] for c in names if c in cells]
        if not got:
            continue

        def col(key: str, digits: int = 1, got: list[dict] = got) -> str:
            return mean_spread([g[key] for g in got], digits)

        copied = [100 * g["names_copied"] for g in got if "names_copied" in g]
        best = [min(h["aer"] for h in g["heads"]) for g in got if g.get("heads")]
        which = [
            1 + min(range(len(g["heads"])), key=lambda k, g=g: g["heads"][k]["aer"])
            for g in got
            if g.get("heads")
        ]
        best_head = f"{mean_spread(best, 2)} (head {'/'.join(map(str, which))})" if best else "-"
        out.append(
            f"| {decoder} | {scorer} | {variant} | {'on' if copy else 'off'} "
            f"| {col('val_bleu_greedy')} | {col('test_bleu_beam5')} "
            f"| {col('train_tokens_per_s', 0)} | {col('decode_sentences_per_s', 1)} "
            f"| {col('attention_entropy', 2)} ({col('uniform_entropy', 2)}) "
            f"| {col('max_share', 2)} | {col('align_precision', 2)} / "
            f"{col('align_recall', 2)} | {col('aer', 2)} | {best_head} "
            f"| {mean_spread(copied) + ' %' if copied else '-'} |"
        )
    return "\n".join(out)


def figure(cells: dict[str, dict], names: list[str], path: Path) -> None:
    """The example sentence's attention in each of the `names` cells, four to a row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in names if n in cells]
    cols = min(4, len(shown))
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.3 * rows), squeeze=False)
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax, name in zip(axes.flat, shown, strict=False):
        ex = cells[name]["example"]
        ax.imshow(ex["attention"], cmap="gray_r", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(ex["source"])), ex["source"], rotation=90, fontsize=7)
        ax.set_yticks(range(len(ex["target"])), ex["target"], fontsize=7)
        ax.set_title(" / ".join(name.split(".seed")[0].split(".")), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=whole(1), default=400, help="updates per cell")
    ap.add_argument("--config", type=Path, default=CONFIG, help="the base config of every cell")
    ap.add_argument("--seeds", type=whole(1), nargs="+", default=[1])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    ap.add_argument(
        "--work",
        type=Path,
        default=ROOT / "runs" / "attention_study",
        help="the cells' runs: a new or empty folder, or one this script filled before",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "attention_study.json")
    ap.add_argument("--figure", type=Path, default=ROOT / "docs" / "attention_study.png")
    ap.add_argument(
        "--sentence", type=whole(0), default=3, help="test sentence of the figure (from 0)"
    )
    ap.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="cells as DECODER.SCORER (each of --variants) or DECODER.SCORER.VARIANT",
    )
    ap.add_argument("--copy", action="store_true", help="each cell with copy attention off and on")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["global"],
        choices=list(VARIANTS),
        help="attention family variants of each cell (global: the config's own attention)",
    )
    args = ap.parse_args()
    # before hours of training: the outputs can be written, and are not the config
    check_output(args.out, "--out", [(args.config, "--config")])
    check_output(args.figure, "--figure", [(args.config, "--config"), (args.out, "--out")])
    args.data, args.work = args.data.resolve(), args.work.resolve()
    WORK.claim(args.work)
    (args.work / "cells").mkdir(exist_ok=True)
    sure, possible = eflomal_links(args.data, args.work / "eflomal", TEST)
    cells: dict[str, dict] = {}
    grid = [(d, s, v) for d in DECODERS for s in SCORERS for v in args.variants]
    if args.only:
        grid = [(d, s, v) for d, s, v in grid if {f"{d}.{s}", f"{d}.{s}.{v}"} & set(args.only)]
    copies = (False, True) if args.copy else (False,)
    first_seed = []
    for seed, (decoder, scorer, variant), copy in itertools.product(args.seeds, grid, copies):
        name = cell_name(decoder, scorer, seed, args.steps, copy, variant)
        done = args.work / "cells" / f"{name}.json"
        if not done.is_file():
            print(f"{name}: training {args.steps} updates ...", flush=True)
            run_dir = args.work / "runs" / name
            train_cell(args, decoder, scorer, seed, run_dir, copy, variant)
            result = evaluate_cell(args, run_dir, sure, possible)
            result["config"] = {"steps": args.steps, "seed": seed, "copy": copy, "variant": variant}
            done.write_text(json.dumps(result))
        cells[name] = json.loads(done.read_text())
        first_seed += [name] if seed == args.seeds[0] else []
        c = cells[name]
        print(
            f"{name}: val {c['val_bleu_greedy']:.1f}, test {c['test_bleu_beam5']:.1f}, "
            f"AER {c['aer']:.2f}, names {100 * c.get('names_copied', 0):.1f} %",
            flush=True,
        )
    print()
    print(table(cells, args.seeds, args.steps))
    record = {"steps": args.steps, "seeds": args.seeds, "cells": cells}
    write_output(args.out, json.dumps(record).encode("utf-8"))
    figure(cells, first_seed, args.figure)
    print(f"\nwritten: {args.out}, {args.figure}")


if __name__ == "__main__":
    with one_line():  # a missing corpus, an output that cannot be written
        main()
