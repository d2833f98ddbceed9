"""Sentencepiece subword models for the source and target side, with fixed special ids.

One model serves both sides when `tokenizer.joint` is true (files `spm.model`), otherwise
each side has its own (`spm.src.model`, `spm.tgt.model`). The special ids are the same in
every model the project trains, so padding and the decoder's start/stop tokens never
depend on the vocabulary: PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import itertools
import json
import os
import random
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from nmt.config import TokenizerConfig
from nmt.errors import NmtError
from nmt.files import atomic_write, read_back

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
EOS_PIECE = "</s>"  # how EOS is shown beside the pieces (attention labels)
UNK_MARK = "\u2047"  # ⁇: what sentencepiece writes for an unknown piece when decoding
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))  # never part of a decoded sentence

JOINT_FILE = "spm.model"
SRC_FILE = "spm.src.model"
TGT_FILE = "spm.tgt.model"
SETTINGS_FILE = "spm.json"  # the tokenizer config a run's models were trained with
TOKENIZER_FILES = (JOINT_FILE, SRC_FILE, TGT_FILE, SETTINGS_FILE)

# Sentencepiece's own sampling (input_sentence_size + shuffle_input_sentence) differs from
# process to process even after set_random_generator_seed; sampling here with a fixed seed
# makes the same corpus and config give byte-identical models.
_SAMPLE_SEED = 1


class TokenizerError(NmtError):
    """A tokenizer model that cannot be trained, read or used."""


class Tokenizer:
    """Source and target sentencepiece models (one shared model when joint)."""

    def __init__(
        self, *, src: spm.SentencePieceProcessor, tgt: spm.SentencePieceProcessor, joint: bool
    ) -> None:
        self._src = src
        self._tgt = tgt
        self.joint = joint

    # ------------------------------------------------------------------ building

    @classmethod
    def train(
        cls,
        src: Iterable[str],
        tgt: Iterable[str],
        cfg: TokenizerConfig,
        out_dir: Path,
        *,
        log: Callable[[str], None] = print,
    ) -> Tokenizer:
        """Train on the two sides of a corpus and write the model file(s) into `out_dir`."""
        if cfg.joint:
            models = {"joint": _train_model(itertools.chain(src, tgt), cfg, "joint")}
        else:
            models = {
                "src": _train_model(src, cfg, "source"),
                "tgt": _train_model(tgt, cfg, "target"),
            }
        tok = cls.from_bytes(models)
        # hard_vocab_limit=False makes sentencepiece stop where the corpus runs out of pieces
        # instead of failing: that size is what the corpus supports, and the config asked
        # for more. Refused before anything is written, with the size to ask for.
        got = min(tok.src_vocab_size, tok.tgt_vocab_size)
        if got < cfg.vocab_size:
            raise TokenizerError(
                f"tokenizer.vocab_size {cfg.vocab_size}: the train split supports at most "
                f"{got} {cfg.type} pieces; set tokenizer.vocab_size to {got} or less"
            )
        tok.write(out_dir)
        settings = json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True)
        atomic_write(Path(out_dir) / SETTINGS_FILE, settings.encode("utf-8"))
        kind = "joint vocabulary" if tok.joint else "vocabularies (source, target)"
        log(f"tokenizer: trained {cfg.type} {kind} of {cfg.vocab_size} in {out_dir}")
        return tok

    def write(self, out_dir: Path) -> None:
        """Write the model file(s) into `out_dir`, where `load` reads them."""
        for name, data in self.to_bytes().items():
            atomic_write(Path(out_dir) / _FILES[name], data)

    @classmethod
    def load(cls, out_dir: Path) -> Tokenizer:
        """Read the model file(s) that `train` wrote into `out_dir`."""
        out_dir = Path(out_dir)
        if (out_dir / JOINT_FILE).is_file():
            names = ["joint"]
        elif (out_dir / SRC_FILE).is_file() and (out_dir / TGT_FILE).is_file():
            names = ["src", "tgt"]
        else:
            raise TokenizerError(
                f"{out_dir}: no tokenizer found (expected {JOINT_FILE}, "
                f"or {SRC_FILE} and {TGT_FILE})"
            )
        return cls.from_bytes({n: (out_dir / _FILES[n]).read_bytes() for n in names})

    @classmethod
    def from_bytes(cls, models: dict[str, bytes]) -> Tokenizer:
        """Rebuild from `to_bytes()` output: {"joint": b} or {"src": b, "tgt": b}."""
        if set(models) == {"joint"}:
            joint = _processor(models["joint"], "joint")
            return cls(src=joint, tgt=joint, joint=True)
        if set(models) == {"src", "tgt"}:
            return cls(
                src=_processor(models["src"], "src"),
                tgt=_processor(models["tgt"], "tgt"),
                joint=False,
            )
        raise TokenizerError(
            f"tokenizer models: expected keys 'joint' or 'src' and 'tgt', got {sorted(models)}"
        )

    def to_bytes(self) -> dict[str, bytes]:
        """The serialized model(s), for checkpoints."""
        if self.joint:
            return {"joint": self._src.serialized_model_proto()}
        return {
            "src": self._src.serialized_model_proto(),
            "tgt": self._tgt.serialized_model_proto(),
        }

    # ------------------------------------------------------------------ using

    @property
    def src_vocab_size(self) -> int:
        return int(self._src.get_piece_size())

    @property
    def tgt_vocab_size(self) -> int:
        return int(self._tgt.get_piece_size())

    def encode_src(self, sentences: list[str]) -> list[list[int]]:
        """Source subword ids, without BOS/EOS (the batcher appends EOS)."""
        return self._src.encode(list(sentences), out_type=int)

    def encode_tgt(self, sentences: list[str]) -> list[list[int]]:
        """Target subword ids, without BOS/EOS (the batcher adds them)."""
        return self._tgt.encode(list(sentences), out_type=int)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        """Detokenized target sentences; PAD, BOS and EOS ids are skipped.

        Why a call a row: sentencepiece decodes a list of rows on a thread pool it starts for
        each call, about 75 µs, and a translation decodes one sentence's n-best at a time
        (1,000 sentences: 75 ms, 7 % of greedy decoding, against 2.4 ms a row at a time)."""
        clean = [[int(i) for i in row if int(i) not in SPECIAL_IDS] for row in ids]
        return [self._tgt.decode(row) for row in clean]

    def src_pieces(self, sentence: str) -> list[str]:
        """The subword strings `encode_src` gives for one sentence (no EOS), for display."""
        return self._src.encode(sentence, out_type=str)

    def encode_src_pieces(self, sentences: list[str]) -> list[SourcePieces]:
        """Each sentence's ids, pieces and surfaces from one sentencepiece call (what
        `encode_src` and `src_pieces` give, and the text each piece covers); the ids read at
        once, the rest when first asked for (`SourcePieces`)."""
        return [
            SourcePieces([p.id for p in found.pieces], found)
            for found in self._src.encode(list(sentences), return_type="proto")
        ]

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        """The subword string of each target id (specials shown as <pad>, <s>, </s>)."""
        return self._tgt.id_to_piece([int(i) for i in ids])  # one call, not one a piece


@dataclasses.dataclass(frozen=True)
class SourcePieces:
    """A source sentence tokenized: its ids (no EOS), and from the same sentencepiece call,
    read when first asked for, its piece strings (for display) and the text each piece covers
    (an unknown piece: the characters it stands for, e.g. an emoji, for copying into a
    translation).

    Why on demand: reading every piece's three fields in Python was most of
    `Translator.prepare`'s time (41-44 ms for test_2016_flickr's 1,000 sentences, 24-27 with
    the ids alone; medians, 2 cores of a Xeon with AMX, session 39), and it comes before any
    worker starts decoding; the strings are read once a translation is back."""

    ids: list[int]
    # sentencepiece's proto of the sentence, or its (pieces, surfaces) read out (pickled)
    found: Any = dataclasses.field(repr=False, compare=False)

    @functools.cached_property
    def _read(self) -> tuple[list[str], list[str]]:
        if isinstance(self.found, tuple):
            return self.found
        pieces = self.found.pieces
        return [p.piece for p in pieces], [p.surface for p in pieces]

    @property
    def pieces(self) -> list[str]:
        return self._read[0][: len(self.ids)]

    @property
    def surfaces(self) -> list[str]:
        return self._read[1][: len(self.ids)]

    def cut(self, n: int) -> SourcePieces:
        """The first `n` pieces (itself where it has no more)."""
        return self if len(self.ids) <= n else SourcePieces(self.ids[:n], self.found)

    def __reduce__(self) -> tuple[Any, ...]:
        # sentencepiece's proto does not pickle: its strings, read out
        return SourcePieces, (self.ids, self._read)


def train_or_load(
    cfg: TokenizerConfig,
    run_dir: Path,
    src: Iterable[str],
    tgt: Iterable[str],
    *,
    log: Callable[[str], None] = print,
) -> Tokenizer:
    """The run's tokenizer: trained once per run directory, then reused.

    The iterables are only consumed when training. A run directory whose models were
    trained with other tokenizer settings is an error rather than silently reused, since
    the config would then say something the run does not do.
    """
    run_dir = Path(run_dir)
    has_models = (run_dir / JOINT_FILE).is_file() or (run_dir / SRC_FILE).is_file()
    if not has_models:
        return Tokenizer.train(src, tgt, cfg, run_dir, log=log)
    settings_path = run_dir / SETTINGS_FILE
    if os.path.lexists(settings_path):  # (a folder, a pipe or a broken link is said: read_back)
        saved = _saved_settings(settings_path, run_dir)
        wanted = dataclasses.asdict(cfg)
        diffs = [f"{k}={saved.get(k)!r}" for k in wanted if saved.get(k) != wanted[k]]
        if diffs:
            raise TokenizerError(
                f"{run_dir}: its tokenizer was trained with tokenizer."
                + ", tokenizer.".join(diffs)
                + f"; the config differs: use a new run.dir or delete {run_dir}/spm.*"
            )
    tok = Tokenizer.load(run_dir)
    if tok.joint != cfg.joint:
        raise TokenizerError(
            f"{run_dir}: holds a {'joint' if tok.joint else 'separate'} tokenizer but "
            f"tokenizer.joint is {str(cfg.joint).lower()}: use a new run.dir or delete "
            f"{run_dir}/spm.*"
        )
    log(f"tokenizer: reusing {run_dir} (vocabulary {tok.src_vocab_size}/{tok.tgt_vocab_size})")
    return tok


def _saved_settings(path: Path, run_dir: Path) -> dict[str, Any]:
    """The tokenizer settings a run wrote (`SETTINGS_FILE`); one line where the file is not
    that (cut short by a full disk, edited by hand): what was trained cannot be told."""
    try:
        saved = json.loads(read_back(path).decode("utf-8"))
        why = "" if isinstance(saved, dict) else "not a mapping of settings"
    except (OSError, ValueError, RecursionError) as e:  # (RecursionError: nested too deep)
        why = str(e)
    if why:
        raise TokenizerError(
            f"{path}: not the tokenizer settings nmt writes ({why}); the settings its models "
            f"were trained with cannot be checked: use a new run.dir or delete {run_dir}/spm.*"
        )
    return saved


_FILES = {"joint": JOINT_FILE, "src": SRC_FILE, "tgt": TGT_FILE}


def _train_model(sentences: Iterable[str], cfg: TokenizerConfig, side: str) -> bytes:
    """Train one sentencepiece model in memory and return its serialized bytes."""
    options: dict[str, Any] = {
        "model_type": cfg.type,
        "vocab_size": cfg.vocab_size,
        "character_coverage": cfg.character_coverage,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "hard_vocab_limit": False,
        "minloglevel": 2,
        "num_threads": 1,
    }
    seen = [0]
    sentences = _non_empty(sentences, seen)
    if cfg.input_sentence_size > 0:
        sentences = iter(_sample(sentences, cfg.input_sentence_size))
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=sentences, model_writer=model, **options)
    except RuntimeError as e:
        if not seen[0]:
            raise TokenizerError(
                f"cannot train the {side} sentencepiece model: the train split has no text"
            ) from None
        raise TokenizerError(f"cannot train the {side} sentencepiece model: {e}") from None
    return model.getvalue()


def _sample(sentences: Iterator[str], n: int) -> list[str]:
    """A uniform random sample of `n` sentences in one pass (reservoir sampling)."""
    rng = random.Random(_SAMPLE_SEED)
    sample: list[str] = []
    for i, sentence in enumerate(sentences):
        if i < n:
            sample.append(sentence)
        elif (j := rng.randrange(i + 1)) < n:
            sample[j] = sentence
    return sample


def _non_empty(sentences: Iterable[str], seen: list[int]) -> Iterator[str]:
    """The non-empty sentences; seen[0] counts them, for a clearer error on none."""
    for s in sentences:
        if s:
            seen[0] += 1
            yield s


def _processor(data: bytes, name: str) -> spm.SentencePieceProcessor:
    """Load a serialized model and check it uses the project's special ids."""
    try:
        sp = spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as e:
        raise TokenizerError(f"tokenizer model '{name}': not a sentencepiece model ({e})") from None
    got = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise TokenizerError(
            f"tokenizer model '{name}': pad/unk/bos/eos ids are {got}; nmt needs "
            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
        )
    return sp
