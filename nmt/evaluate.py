"""Corpus BLEU and chrF through sacrebleu, with signatures, for validation and `nmt eval`;
and the eval run itself: a test set translated, written and scored (`evaluate_split`).

Scores are never computed by hand: sacrebleu does the tokenisation, counting and
smoothing, and its signature says exactly how, so a number printed here is the number
`sacrebleu REF -i HYP` prints for the same files.

Two protocols:

- `sacrebleu` (default): detokenized, cased text, sacrebleu's own 13a tokenisation.
- `wmt-mmt`: the Multi30k shared-task protocol (WMT 2016-2018 multimodal translation), to
  set our numbers beside the papers'. Hypotheses and references both go through the task's
  own preprocessing (multi30k/dataset scripts/task1-tokenize.sh: `lowercase.perl |
  normalize-punctuation.perl -l L | tokenizer.perl -l L`, here with sacremoses), then BLEU is
  taken on those tokens as they are (tokenize="none"), which is what multi-bleu.perl computes
  on the task's tokenized files. Moses escaping (`'` -> `&apos;`) is left out: it maps tokens
  one to one on both sides, so BLEU is the same with or without it.

sacrebleu and sacremoses are imported when a score is asked for, not with this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from nmt.errors import NmtError
from nmt.files import write_lines

if TYPE_CHECKING:
    from nmt.config import Config
    from nmt.translate import Translator

Protocol = Literal["sacrebleu", "wmt-mmt"]
PROTOCOLS: tuple[Protocol, ...] = ("sacrebleu", "wmt-mmt")

# sacrebleu's command line prints scores with one decimal; the line matches it.
LINE_WIDTH = 1


@dataclass(frozen=True)
class Score:
    """One corpus-level score with what is needed to reproduce it."""

    name: str  # "BLEU" or "chrF2"
    score: float  # full precision
    signature: str  # sacrebleu's signature (prefixed by the protocol when not sacrebleu's)
    line: str  # the line sacrebleu's command line prints: "BLEU|<signature> = 41.2 ..."

    def __str__(self) -> str:
        return self.line


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references: expected as many")


def _score(metric: Any, hyps: Sequence[str], refs: Sequence[str], prefix: str = "") -> Score:
    result = metric.corpus_score(list(hyps), [list(refs)])
    signature = prefix + str(metric.get_signature())
    return Score(
        name=result.name,
        score=float(result.score),
        signature=signature,
        line=result.format(width=LINE_WIDTH, signature=signature),
    )


def mmt_preprocess(lines: Sequence[str], lang: str) -> list[str]:
    """Lowercase, normalise punctuation and Moses-tokenize, as the Multi30k task does."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer = MosesPunctNormalizer(lang=lang)
    tokenizer = MosesTokenizer(lang=lang)
    return [
        tokenizer.tokenize(normalizer.normalize(line.lower()), escape=False, return_str=True)
        for line in lines
    ]


def bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    *,
    lowercase: bool = False,
    protocol: Protocol = "sacrebleu",
    lang: str | None = None,
) -> Score:
    """Corpus BLEU of `hyps` against one reference each.

    protocol "wmt-mmt" needs `lang`, the target language (Moses rules differ by language),
    and always lowercases.
    """
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)
    if protocol == "sacrebleu":
        return _score(BLEU(lowercase=lowercase), hyps, refs)
    if protocol == "wmt-mmt":
        if not lang:
            raise ValueError("bleu: protocol 'wmt-mmt' needs the target language (lang)")
        prefix = f"protocol:wmt-mmt|lang:{lang}|"
        # lowercase=True changes nothing in text already lowercased; it puts case:lc in the
        # signature, which is what was done. force=True: the text is tokenized on purpose,
        # so sacrebleu's "forgot to detokenize?" warning does not apply.
        metric = BLEU(lowercase=True, tokenize="none", force=True)
        return _score(metric, mmt_preprocess(hyps, lang), mmt_preprocess(refs, lang), prefix)
    raise ValueError(f"protocol: unknown {protocol!r}; expected one of {', '.join(PROTOCOLS)}")


def chrf(hyps: Sequence[str], refs: Sequence[str], *, lowercase: bool = False) -> Score:
    """Corpus chrF (character 6-grams, beta 2) of `hyps` against one reference each."""
    from sacrebleu.metrics import CHRF

    _check(hyps, refs)
    return _score(CHRF(lowercase=lowercase), hyps, refs)


# --------------------------------------------------------------------------- the eval run


TestSet = tuple[str, list[str], list[str]]  # (name, sources, references)


def read_test_set(src: Path, ref: Path) -> TestSet:
    """`nmt eval --src --ref`'s files (named by their flags in its messages), named after
    the source (test_2016_flickr.en -> test_2016_flickr); read and checked before any model
    loads."""
    from nmt.files import read_lines

    name = src.name.split(".")[0] or src.name
    sources, references = read_lines(src), read_lines(ref)
    if not sources:
        raise NmtError(f"--src {src}: empty; expected one sentence a line")
    if len(sources) != len(references):
        raise NmtError(
            f"--src {src} has {len(sources)} lines but --ref {ref} has {len(references)}: "
            "they must be aligned line by line"
        )
    return name, sources, references


def choose_test_sets(
    model_config: Config,
    run_dir: Path | None,
    *,
    given: TestSet | None = None,
    other: Config | None = None,
    other_path: Path | None = None,
) -> list[TestSet]:
    """What `nmt eval` scores: the files given, else another config's test splits (which must
    be in the model's language pair), else the run's own, read from its cache."""
    if given is not None:
        return [given]
    pair = (model_config.data.src_lang, model_config.data.tgt_lang)
    if other is not None and (other.data.src_lang, other.data.tgt_lang) != pair:
        raise NmtError(
            f"{other_path}: its test sets are {other.data.src_lang}->"
            f"{other.data.tgt_lang}, but the model translates {pair[0]}->{pair[1]}"
        )
    # the run's cache, in a run directory nmt made; else datasets' own (not the user's folder)
    cache = run_dir / "data" / "hf" if _made_by_nmt(run_dir) else None
    return test_sets(other or model_config, cache)


def test_sets(config: Config, cache_dir: Path | None) -> list[TestSet]:
    """The config's test split(s) as (name, sources, references), read as training read them
    (lowercased when data.lowercase). `NMT_DATA_DIR` overrides data.root, as for training."""
    from nmt.config import apply_data_dir_env, config_from_dict
    from nmt.corpus import load_split, load_splits, split_name

    data = config_from_dict(apply_data_dir_env(config.to_dict())).data
    corpora = data.corpus_list()
    if any(c.test_size for c in corpora):  # held out of a train split, as `nmt train` did
        named = [
            (r.name, r.texts) for r in load_splits(data, cache_dir=cache_dir) if r.role == "test"
        ]
    else:
        named = [
            (split_name(data, c, split), load_split(data, split, corpus=c, cache_dir=cache_dir))
            for c in corpora
            for split in c.test
        ]
    if not named:
        raise NmtError("data.test: the run's config names no test split; pass --src and --ref")
    return [(name, ds["src"][:], ds["tgt"][:]) for name, ds in named]


@dataclass
class EvalReport:
    """One test set translated and scored."""

    split: str
    n: int
    beam: int
    seconds: float
    scores: dict[str, Score]  # "bleu" and/or "chrf"
    protocol: Protocol
    hypotheses: Path | None  # None: not kept (`default_hypotheses`)

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
            "hypotheses": None if self.hypotheses is None else str(self.hypotheses),
        }


def _made_by_nmt(run_dir: Path | None) -> TypeGuard[Path]:
    """`nmt.run_dir.made_by_nmt`, imported when asked: that module brings torch, this one
    stays light for what imports it only to score."""
    from nmt.run_dir import made_by_nmt

    return run_dir is not None and made_by_nmt(run_dir)


def default_hypotheses(run_dir: Path | None, split: str, beam: int) -> Path | None:
    """Where `nmt eval` keeps the hypotheses when not told: `<run_dir>/eval/<split>.beamK.hyp`
    in a run directory nmt made; None (not kept) for a checkpoint elsewhere, whose folder is
    the user's."""
    if not _made_by_nmt(run_dir):
        return None
    file = split.replace("/", ".")  # a corpus/split name stays one file in eval/
    return run_dir / "eval" / f"{file}.beam{beam}.hyp"


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
    `default_hypotheses`'s, and score them against `references`."""
    if len(sources) != len(references):
        raise NmtError(
            f"{split}: {len(sources)} source lines but {len(references)} reference lines"
        )
    beam = translator.config.decode.beam if beam is None else beam
    start = time.perf_counter()
    out = translator.translate(
        sources, beam=beam, batch_size=batch_size, progress=progress, with_copy_shares=False
    )
    seconds = time.perf_counter() - start
    hyps = [t.text for t in out]
    if hyp_path is None:
        hyp_path = default_hypotheses(translator.run_dir, split, beam)
    if hyp_path is not None:
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
