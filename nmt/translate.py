"""Translating with a trained model: `Translator.from_checkpoint(path).translate(sentences)`.

Also what `nmt translate` and `nmt eval` show and write: the attention matrix as text
and as a heatmap, and a test set translated and scored (`evaluate_split`).

Sentences are batched by length (sorted, then returned in input order), so padding stays
small; the search never lets one sentence change another's result, so this reordering is
invisible in the output.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nmt import runtime
from nmt.batching import collate
from nmt.checkpoint import load_for_inference
from nmt.config import Config
from nmt.errors import NmtError
from nmt.evaluate import Protocol, Score, bleu, chrf
from nmt.runtime import Precision, autocast
from nmt.search import Hypothesis, beam_search, greedy, normalise

if TYPE_CHECKING:
    from nmt.model import Seq2Seq
    from nmt.tokenizer import Tokenizer

EOS_PIECE = "</s>"


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


@dataclass
class Translation:
    """One translated sentence with what it was made from."""

    source: str  # the input line as given
    text: str  # the best translation, detokenized; "" for an empty input
    score: float  # log-probability under the length penalty (decode.length_penalty)
    tokens: list[str]  # target subword pieces of `text` (no EOS)
    src_tokens: list[str]  # source pieces the model read, EOS last ("</s>")
    attention: Tensor  # (T, S) float32; S = len(src_tokens); T = len(tgt_labels)
    finished: bool  # False when the length limit cut it before EOS, or the input was empty
    nbest: list[tuple[str, float]] = field(default_factory=list)  # (text, score), best first
    truncated: bool = False  # the source was longer than data.max_len and was cut

    @property
    def tgt_labels(self) -> list[str]:
        """Row labels of `attention`: the target pieces, then EOS when the output ended."""
        return self.tokens + ([EOS_PIECE] if self.finished else [])


class Translator:
    """A model, its tokenizer and decoding settings, ready to translate lists of sentences."""

    def __init__(
        self,
        *,
        model: Seq2Seq,
        tokenizer: Tokenizer,
        config: Config,
        device: torch.device,
        precision: Precision,
        path: Path | None,
        log: Callable[[str], None],
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.device = device
        self.precision = precision
        self.path = path  # the checkpoint file, when loaded from one
        self.log = log

    @classmethod
    def from_checkpoint(
        cls,
        path_or_run_dir: str | Path | None = None,
        device: str = "cpu",
        *,
        precision: str = "fp32",
        log: Callable[[str], None] = _warn,
    ) -> Translator:
        """Load a checkpoint file, a run directory (its best, else last checkpoint), or with
        nothing given the most recently trained run (`runs/latest`).

        `precision` bf16 runs the model under autocast: about twice as fast on CPUs with
        bf16 matrix units, with scores that differ in the third decimal. `log` receives
        warnings (long inputs cut); by default they are Python warnings.
        """
        dev = runtime.resolve_device(device, setting="--device")
        prec = runtime.resolve_precision(precision, dev, setting="--precision")
        loaded = load_for_inference(path_or_run_dir, dev)
        return cls(
            model=loaded.model,
            tokenizer=loaded.tokenizer,
            config=loaded.config,
            device=dev,
            precision=prec,
            path=loaded.path,
            log=log,
        )

    @property
    def run_dir(self) -> Path | None:
        return None if self.path is None else self.path.parent

    def translate(
        self,
        sentences: Sequence[str],
        *,
        beam: int | None = None,
        nbest: int = 1,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[Translation]:
        """Translate `sentences`, in order. beam 1 is greedy search; `beam` and `batch_size`
        default to the checkpoint's decode settings. `progress` draws a bar on stderr."""
        dc = self.config.decode
        beam = dc.beam if beam is None else beam
        batch_size = dc.batch_size if batch_size is None else batch_size
        if beam < 1:
            raise NmtError(f"--beam {beam}: expected at least 1")
        if not 1 <= nbest <= beam:
            raise NmtError(f"--nbest {nbest}: expected 1 to the beam size ({beam})")
        if batch_size < 1:
            raise NmtError(f"--batch-size {batch_size}: expected at least 1")

        texts = [self._clean(s) for s in sentences]
        ids = self.tokenizer.encode_src(texts) if texts else []
        max_len = self.config.data.max_len
        truncated = [len(row) > max_len for row in ids]
        if any(truncated):
            where = [str(i + 1) for i, t in enumerate(truncated) if t]
            self.log(
                f"{len(where)} input(s) longer than the model's {max_len} subword tokens "
                f"(data.max_len) were cut to it: line(s) {', '.join(where[:10])}"
                + (" ..." if len(where) > 10 else "")
            )
        ids = [row[:max_len] for row in ids]
        todo = [i for i, row in enumerate(ids) if row]  # empty inputs give empty outputs
        todo.sort(key=lambda i: len(ids[i]), reverse=True)
        batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]

        out: list[Translation | None] = [None] * len(texts)
        for rows in _progress(batches, enabled=progress, total=len(todo)):
            hyps = self._search([ids[r] for r in rows], beam=beam, nbest=nbest)
            for r, sentence_hyps in zip(rows, hyps, strict=True):
                out[r] = self._translation(
                    sentences[r], texts[r], sentence_hyps, truncated=truncated[r]
                )
        for i, t in enumerate(out):
            if t is None:
                out[i] = Translation(
                    source=sentences[i],
                    text="",
                    score=0.0,
                    tokens=[],
                    src_tokens=[],
                    attention=torch.zeros(0, 0),
                    finished=False,
                    nbest=[("", 0.0)],
                )
        return [t for t in out if t is not None]

    def _clean(self, sentence: str) -> str:
        """What the model was trained on: stripped, lowercased when data.lowercase."""
        text = " ".join(sentence.split())
        return text.lower() if self.config.data.lowercase else text

    def _search(self, rows: list[list[int]], *, beam: int, nbest: int) -> list[list[Hypothesis]]:
        batch = collate(rows, None, range(len(rows))).to(self.device)
        with autocast(self.device, self.precision):
            return self._run_search(batch.src, batch.src_lens, beam=beam, nbest=nbest)

    def _run_search(
        self, src: Tensor, src_lens: Tensor, *, beam: int, nbest: int
    ) -> list[list[Hypothesis]]:
        dc = self.config.decode
        if beam == 1:
            result = greedy(
                self.model,
                src,
                src_lens,
                max_len_ratio=dc.max_len_ratio,
                max_len_const=dc.max_len_const,
                min_len=dc.min_len,
            )
            # Scored like beam search's outputs, so that the two can be compared.
            for (h,) in result.hypotheses:
                length = len(h.tokens) + (1 if h.finished else 0)
                h.score = normalise(
                    h.logprob, length, length_penalty=dc.length_penalty, alpha=dc.alpha
                )
        else:
            result = beam_search(
                self.model,
                src,
                src_lens,
                beam=beam,
                nbest=nbest,
                length_penalty=dc.length_penalty,
                alpha=dc.alpha,
                max_len_ratio=dc.max_len_ratio,
                max_len_const=dc.max_len_const,
                min_len=dc.min_len,
            )
        return result.hypotheses

    def _translation(
        self, source: str, text: str, hyps: list[Hypothesis], *, truncated: bool
    ) -> Translation:
        tok = self.tokenizer
        texts = tok.decode_tgt([h.tokens for h in hyps])
        best = hyps[0]
        src_tokens = tok.src_pieces(text)[: self.config.data.max_len] + [EOS_PIECE]
        return Translation(
            source=source,
            text=texts[0],
            score=best.score,
            tokens=tok.tgt_pieces(best.tokens),
            src_tokens=src_tokens,
            attention=best.attention,
            finished=best.finished,
            nbest=[(t, h.score) for t, h in zip(texts, hyps, strict=True)],
            truncated=truncated,
        )


def _progress(batches: list[list[int]], *, enabled: bool, total: int) -> Iterator[list[int]]:
    """Yield the batches, with a bar on stderr counting sentences when `enabled`."""
    if not enabled or len(batches) < 2:
        yield from batches
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    columns = ("translating", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("translating", total=total)
        for rows in batches:
            yield rows
            bar.advance(task, len(rows))


# --------------------------------------------------------------------------- attention


def format_attention(t: Translation) -> str:
    """The attention matrix as aligned text: source pieces across, target pieces down,
    weights in percent ("." below 5%, so that the alignment stands out)."""
    if not t.src_tokens:
        return "(empty input: no attention)"
    rows = t.tgt_labels
    label_w = max([len(r) for r in rows] + [1])
    widths = [max(len(s), 3) for s in t.src_tokens]
    header = " ".join(s.rjust(w) for s, w in zip(t.src_tokens, widths, strict=True))
    lines = [" " * label_w + " " + header]
    for label, weights in zip(rows, t.attention.tolist(), strict=True):
        cells = [
            (f"{round(100 * v)}" if v >= 0.05 else ".").rjust(w)
            for v, w in zip(weights, widths, strict=True)
        ]
        lines.append(label.ljust(label_w) + " " + " ".join(cells))
    return "\n".join(lines)


def plot_paths(path: Path, n: int) -> list[Path]:
    """Where the heatmaps of `n` sentences go: `path` itself for one sentence, otherwise
    `stem-1.png`, `stem-2.png`, ... numbered by input line, next to it."""
    if n == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i}{path.suffix or '.png'}") for i in range(1, n + 1)]


def plot_attention(t: Translation, path: Path) -> None:
    """Write the attention heatmap as a PNG, read like Bahdanau et al. (2015), figure 3:
    source pieces across the top, target pieces down, white = all the weight, black = none."""
    from matplotlib.figure import Figure

    if not t.src_tokens:
        raise NmtError(f"{path}: no attention to plot for an empty input")
    rows, cols = t.tgt_labels, t.src_tokens
    cell = 0.35  # inches per token
    fig = Figure(figsize=(max(3.0, 1.5 + cell * len(cols)), max(2.5, 1.5 + cell * len(rows))))
    ax = fig.add_subplot()
    ax.imshow(t.attention.numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks(range(len(cols)), cols, rotation=90)
    ax.set_yticks(range(len(rows)), rows)
    ax.xaxis.tick_top()
    ax.tick_params(length=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # Pieces in scripts the default font lacks are drawn as boxes; the plot still reads.
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(path, format="png", dpi=100, bbox_inches="tight")


# --------------------------------------------------------------------------- files


def read_lines(path: Path | None) -> list[str]:
    """The lines of a UTF-8 file, or of stdin when `path` is None.

    Lines are split on "\n" only (a trailing "\r" is dropped): `str.splitlines` would also
    split on characters such as U+2028 inside a sentence and misalign sources and references.
    """
    try:
        if path is None:
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
            where = "stdin"
        else:
            data = path.read_bytes()
            where = str(path)
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8-sig")  # tolerate the byte-order mark some editors write
    except UnicodeDecodeError as e:
        raise NmtError(f"{where}: not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def write_lines(path: Path, lines: Sequence[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_sets(config: Config, cache_dir: Path | None) -> list[tuple[str, list[str], list[str]]]:
    """The config's test split(s) as (name, sources, references), read as training read them
    (lowercased when data.lowercase). `NMT_DATA_DIR` overrides data.dir, as for training."""
    from nmt.config import DATA_DIR_ENV
    from nmt.data import load_split, load_splits

    data = config.data
    if os.environ.get(DATA_DIR_ENV):
        data = dataclasses.replace(data, dir=os.environ[DATA_DIR_ENV])
    if data.test:
        named = [(name, load_split(data, name, cache_dir=cache_dir)) for name in data.test]
    elif data.test_size:  # held out of the train split, as `nmt train` did
        named = [
            (name, ds)
            for role, name, ds in load_splits(data, cache_dir=cache_dir)
            if role == "test"
        ]
    else:
        raise NmtError("data.test: the run's config names no test split; pass --src and --ref")
    return [(name, ds["src"][:], ds["tgt"][:]) for name, ds in named]


# --------------------------------------------------------------------------- evaluation


@dataclass
class EvalReport:
    """One test set translated and scored."""

    split: str
    n: int
    beam: int
    seconds: float
    scores: dict[str, Score]  # "bleu" and/or "chrf"
    protocol: Protocol
    hypotheses: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            **{name: s.score for name, s in self.scores.items()},
            "signature": {name: s.signature for name, s in self.scores.items()},
            "protocol": self.protocol,
            "n": self.n,
            "beam": self.beam,
            "seconds": round(self.seconds, 3),
            "sentences_per_s": round(self.n / self.seconds, 2) if self.seconds > 0 else None,
            "hypotheses": str(self.hypotheses),
        }


def evaluate_split(
    translator: Translator,
    *,
    split: str,
    sources: Sequence[str],
    references: Sequence[str],
    hyp_path: Path | None,
    metrics: Sequence[str],
    beam: int | None,
    batch_size: int | None,
    lowercase: bool,
    protocol: Protocol,
    progress: bool,
) -> EvalReport:
    """Translate `sources`, write the hypotheses (one a line) to `hyp_path`, by default
    `<run_dir>/eval/<split>.beam<K>.hyp`, and score them against `references`."""
    if len(sources) != len(references):
        raise NmtError(
            f"{split}: {len(sources)} source lines but {len(references)} reference lines"
        )
    beam = translator.config.decode.beam if beam is None else beam
    start = time.perf_counter()
    out = translator.translate(sources, beam=beam, batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    hyps = [t.text for t in out]
    if hyp_path is None:
        hyp_path = (translator.run_dir or Path(".")) / "eval" / f"{split}.beam{beam}.hyp"
    write_lines(hyp_path, hyps)
    scores: dict[str, Score] = {}
    if "bleu" in metrics:
        lang = translator.config.data.tgt_lang
        scores["bleu"] = bleu(hyps, references, lowercase=lowercase, protocol=protocol, lang=lang)
    if "chrf" in metrics:
        scores["chrf"] = chrf(hyps, references, lowercase=lowercase or protocol == "wmt-mmt")
    return EvalReport(
        split=split,
        n=len(hyps),
        beam=beam,
        seconds=seconds,
        scores=scores,
        protocol=protocol,
        hypotheses=hyp_path,
    )
