"""Translating with a trained model: `Translator.from_checkpoint(path).translate(sentences)`.

The attention is shown by `nmt.display`; a test set is translated and scored by
`nmt.evaluate.evaluate_split`.

Sentences are batched by length (sorted, then returned in input order), so padding stays
small; the search never lets one sentence change another's result, so this reordering is
invisible in the output.
"""

from __future__ import annotations

import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from nmt import laid_out, runtime
from nmt.batching import collate
from nmt.checkpoint import load_for_inference
from nmt.config import Config
from nmt.ensemble import Ensemble, check_compatible
from nmt.int8 import quantize
from nmt.model import Seq2Seq
from nmt.run_dir import resolve_checkpoint
from nmt.runtime import Precision, autocast
from nmt.search import Decodable, Hypothesis, check_decode_args, decode
from nmt.text import clean_input, fill_unknowns
from nmt.tokenizer import EOS_PIECE, UNK_ID, SourcePieces
from nmt.workers import check_workers, pool

if TYPE_CHECKING:
    from nmt.tokenizer import Tokenizer


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


@dataclass(frozen=True)
class Source:
    """A sentence made ready to decode (`Translator.prepare`): cleaned and tokenized once."""

    sentence: str  # the input as given
    text: str  # what the model reads of it (`nmt.text.clean_input`)
    shouted: bool  # written in capitals: read in sentence case, answered in capitals
    pieces: SourcePieces  # cut to data.max_len
    truncated: bool  # it was longer than data.max_len


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
    copied: list[float] | None = None  # copy attention: per row of `attention`, the share copied
    heads: Tensor | None = None  # (H, T, S) each attention head's weights, when asked for

    def attention_of(self, head: int) -> Tensor:
        """(T, S): head `head`'s weights (1 .. H, `heads` filled), or with 0 `attention`
        (the heads' mean)."""
        if head == 0 or self.heads is None:
            return self.attention
        return self.heads[head - 1]

    @property
    def tgt_labels(self) -> list[str]:
        """Row labels of `attention`: the target pieces, then EOS when the output ended."""
        return self.tokens + ([EOS_PIECE] if self.finished else [])


class Translator:
    """A model, its tokenizer and decoding settings, ready to translate lists of sentences."""

    def __init__(
        self,
        *,
        model: Decodable,
        tokenizer: Tokenizer,
        config: Config,
        device: torch.device,
        precision: Precision,
        path: Path | None,
        log: Callable[[str], None],
        laid: bool = False,
        workers: int = 1,
    ) -> None:
        check_workers(workers, device)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.device = device
        self.precision = precision
        self.path = path  # the checkpoint file, when loaded from one
        self.log = log
        # A laid-out model (`nmt.laid_out`) runs its bf16 products itself, outside autocast.
        self.autocast_precision: Precision = "fp32" if laid else precision
        self.workers = workers  # processes that decode a call's batches (`nmt.workers`)

    @classmethod
    def from_checkpoint(
        cls,
        path_or_run_dir: str | Path | Sequence[str | Path] | None = None,
        device: str = "cpu",
        *,
        precision: str = "fp32",
        log: Callable[[str], None] = _warn,
        shortlist: bool = True,
        int8: bool = False,
        workers: int = 1,
    ) -> Translator:
        """Load a checkpoint file, a run directory (averaged.pt, else best.pt, else last.pt),
        or with nothing given the most recently trained run (`runs/latest`). A list of
        several is an ensemble (`nmt.ensemble`): they must share the tokenizer; the decoding
        settings and length limits are the first one's.

        `precision` bf16 runs the model under autocast, or on a CPU with bf16 units its
        products alone in bf16, on weights laid out once (`nmt.laid_out`); scores differ
        slightly either way. `log` receives warnings (long inputs cut); by default they are
        Python warnings. `shortlist=False` decodes over the whole vocabulary even where the
        checkpoint has a shortlist (`nmt.shortlist`). `int8=True` (CPU) gives the models int8
        weights (`nmt.int8`). `workers` > 1 (CPU) decodes the batches of each `translate`
        call in that many processes (`nmt.workers`).
        """
        dev = runtime.resolve_device(device, setting="--device")
        check_workers(workers, dev)  # before loading anything
        prec = runtime.resolve_precision(precision, dev, setting="--precision")
        runtime.configure_device(dev)  # TF32 as in training, so that scores agree
        paths: list[str | Path | None]
        if isinstance(path_or_run_dir, (str, Path)) or path_or_run_dir is None:
            paths = [path_or_run_dir]
        else:
            paths = list(path_or_run_dir) or [None]
        loaded = [load_for_inference(resolve_checkpoint(p), dev) for p in paths]
        if not shortlist or len(loaded) > 1:  # an ensemble's members would differ in columns
            for x in loaded:
                x.model.shortlist = None
        laid = not int8 and laid_out.applies(dev.type, prec)  # the same layers, bf16
        for x in loaded:
            if int8:
                quantize(x.model, dev.type)
            elif laid:
                laid_out.lay_out(x.model)
        first = loaded[0]
        model: Decodable = first.model
        if len(loaded) > 1:
            check_compatible([x.tokenizer for x in loaded], [x.path for x in loaded])
            model = Ensemble([x.model for x in loaded])
        runtime.freeze_gc()
        return cls(
            model=model,
            tokenizer=first.tokenizer,
            config=first.config,
            device=dev,
            precision=prec,
            path=first.path,
            log=log,
            laid=laid,
            workers=workers,
        )

    @property
    def heads(self) -> int | None:
        """The model's attention heads; None for an ensemble (its heads are no one model's)."""
        return None if isinstance(self.model, Ensemble) else self.config.model.attention_heads

    @property
    def run_dir(self) -> Path | None:
        return None if self.path is None else self.path.parent

    def prepare(self, sentences: Sequence[str]) -> list[Source]:
        """The sentences as the model reads them, each cleaned (`nmt.text.clean_input`) and
        tokenized once, cut to `data.max_len` pieces (said through `log`)."""
        cleaned = [clean_input(s, lowercase=self.config.data.lowercase) for s in sentences]
        encoded = self.tokenizer.encode_src_pieces([t for t, _ in cleaned]) if cleaned else []
        max_len = self.config.data.max_len
        out = [
            Source(sentence, text, shouted, pieces.cut(max_len), len(pieces.ids) > max_len)
            for sentence, (text, shouted), pieces in zip(sentences, cleaned, encoded, strict=True)
        ]
        where = [str(i + 1) for i, s in enumerate(out) if s.truncated]
        if where:
            self.log(
                f"{len(where)} input(s) longer than the model's {max_len} subword tokens "
                f"(data.max_len) were cut to it: line(s) {', '.join(where[:10])}"
                + (" ..." if len(where) > 10 else "")
            )
        return out

    def translate(
        self,
        sentences: Sequence[str] | Sequence[Source],
        *,
        beam: int | None = None,
        nbest: int = 1,
        batch_size: int | None = None,
        progress: bool = False,
        with_copy_shares: bool = True,
        with_heads: bool = False,
    ) -> list[Translation]:
        """Translate `sentences` (or the `Source`s `prepare` made of them), in order. beam 1
        is greedy search; `beam` and `batch_size` default to the checkpoint's decode
        settings. `progress` draws a bar on stderr. `with_copy_shares=False` skips a copy
        model's `Translation.copied` (one teacher-forced pass a batch) where nobody shows
        it; `with_heads=True` fills `Translation.heads` (in the same pass)."""
        dc = self.config.decode
        beam = dc.beam if beam is None else beam
        batch_size = dc.batch_size if batch_size is None else batch_size
        check_decode_args(beam=beam, nbest=nbest, batch_size=batch_size)
        if all(isinstance(s, Source) for s in sentences):
            ready = typing.cast(list[Source], list(sentences))
        else:
            ready = self.prepare([str(s) for s in sentences])
        todo = [i for i, s in enumerate(ready) if s.pieces.ids]  # empty inputs: empty outputs
        todo.sort(key=lambda i: len(ready[i].pieces.ids), reverse=True)
        batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
        out = [_empty(s.sentence) for s in ready]

        def search(rows: list[int]) -> tuple[list[list[Hypothesis]], list[Reread]]:
            ids = [ready[r].pieces.ids for r in rows]
            return self._search(
                ids, beam=beam, nbest=nbest, shares=with_copy_shares, heads=with_heads
            )

        # no more processes than batches (one batch: none started); before the bar's thread
        with pool(search, max(1, min(self.workers, len(batches)))) as mapped:
            found = mapped(batches)
            bar = _progress(batches, enabled=progress, total=len(todo))
            for rows, (hyps, again) in zip(bar, found, strict=True):
                for r, sentence_hyps, (copied, heads) in zip(rows, hyps, again, strict=True):
                    out[r] = self._translation(ready[r], sentence_hyps, copied=copied, heads=heads)
        return out

    def _search(
        self, rows: list[list[int]], *, beam: int, nbest: int, shares: bool, heads: bool
    ) -> tuple[list[list[Hypothesis]], list[Reread]]:
        """The hypotheses of each of `rows` (in that order) and what re-reading the best one
        gives (`reread`)."""
        batch = collate(rows, None, range(len(rows))).to(self.device)
        with autocast(self.device, self.autocast_precision):
            found = decode(
                self.model, batch.src, batch.src_lens, self.config.decode, beam=beam, nbest=nbest
            )
            hyps = found.hypotheses
            best = [h[0] for h in hyps]
            again = reread(self.model, batch.src, batch.src_lens, best, shares=shares, heads=heads)
        # collate sorts by length: back to the order of `rows`
        at = {row: b for b, row in enumerate(batch.index.tolist())}
        order = [at[i] for i in range(len(rows))]
        return [hyps[b] for b in order], [again[b] for b in order]

    def _translation(
        self,
        source: Source,
        hyps: list[Hypothesis],
        *,
        copied: list[float] | None,
        heads: Tensor | None,
    ) -> Translation:
        texts = self.tokenizer.decode_tgt([h.tokens for h in hyps])
        surfaces = source.pieces.surfaces
        texts = [
            fill_unknowns(t, _unknown_sources(h, len(surfaces)), surfaces)
            if UNK_ID in h.tokens
            else t
            for t, h in zip(texts, hyps, strict=True)
        ]
        if source.shouted:
            texts = [t.upper() for t in texts]
        best = hyps[0]
        return Translation(
            source=source.sentence,
            text=texts[0],
            score=best.score,
            tokens=self.tokenizer.tgt_pieces(best.tokens),
            src_tokens=[*source.pieces.pieces, EOS_PIECE],
            attention=best.attention,
            finished=best.finished,
            nbest=[(t, h.score) for t, h in zip(texts, hyps, strict=True)],
            truncated=source.truncated,
            copied=copied,
            heads=heads,
        )


def _unknown_sources(h: Hypothesis, n_src: int) -> list[int]:
    """For each unknown piece of `h`, the source piece its attention weighs most (the EOS
    column left out)."""
    unknowns = [t for t, token in enumerate(h.tokens) if token == UNK_ID]
    return [int(h.attention[t, :n_src].argmax()) for t in unknowns]


def _empty(sentence: str) -> Translation:
    """The translation of an input with nothing to translate."""
    return Translation(
        source=sentence,
        text="",
        score=0.0,
        tokens=[],
        src_tokens=[],
        attention=torch.zeros(0, 0),
        finished=False,
        nbest=[("", 0.0)],
    )


# What re-reading one best hypothesis gives: its copy shares and each head's weights.
Reread = tuple[list[float] | None, Tensor | None]


@torch.inference_mode()
def reread(
    model: Decodable,
    src: Tensor,
    src_lens: Tensor,
    best: Sequence[Hypothesis],
    *,
    shares: bool = True,
    heads: bool = False,
) -> list[Reread]:
    """Per hypothesis of `best`, by re-reading it teacher-forced (what the search saw,
    without carrying it through the search), one pass for both:
    - with `shares`, for a copy model (an ensemble: the mean of its copy members), the share
      of each target piece (and final EOS) copied from the source, 1 − g; else None;
    - with `heads`, for one model (not an ensemble), each attention head's weights
      (H, T, S), T counting the final EOS; else None."""
    members = model.models if isinstance(model, Ensemble) else [model]
    gated = [m for m in members if isinstance(m, Seq2Seq) and m.copy_gate is not None]
    gated = gated if shares else []
    looked = model if heads and isinstance(model, Seq2Seq) else None
    if not gated and looked is None:
        return [(None, None)] * len(best)
    targets = [h.tokens for h in best]
    tgt_in = collate([[]] * len(best), targets, range(len(best))).tgt_in.to(src.device)  # BOS, y
    read = list(dict.fromkeys([*gated, *([looked] if looked is not None else [])]))
    outs = {id(m): m(src, src_lens, tgt_in, heads=m is looked) for m in read}
    copied = None
    if gated:
        copied = torch.stack([outs[id(m)].copied for m in gated]).mean(0).float().cpu()  # (B, T)
    per_head = None if looked is None else outs[id(looked)].heads  # (B, H, T, S)
    found = []
    for b, h in enumerate(best):
        rows = len(h.tokens) + (1 if h.finished else 0)
        c = None if copied is None else copied[b, :rows].tolist()
        w = None if per_head is None else per_head[b, :, :rows, : h.attention.size(1)].float().cpu()
        found.append((c, w))
    return found


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
