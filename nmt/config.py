"""Configuration: YAML -> frozen, typed dataclasses, validated at load time.

Every key a run understands is declared once here, with its type, default and allowed
range. `load_config` reports every problem at once (unknown keys with a "did you mean",
wrong types, out-of-range numbers, invalid choices), each with its key path.
Standard library + PyYAML only, so `nmt check-config` stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from nmt.errors import NmtError

DATA_DIR_ENV = "NMT_DATA_DIR"


class ConfigError(NmtError, ValueError):
    """One or more problems in a configuration; `problems` holds one line each."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: " + "; ".join(problems))


def _opt(
    default: Any,
    *,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    help: str = "",
):
    """A field with an allowed range (`above`: a strict lower bound); `help` documents it."""
    return field(default=default, metadata={"min": min, "max": max, "above": above, "help": help})


# Names people bring from other toolkits, mapped to ours.
ATTENTION_ALIASES = {
    "general": "bilinear",
    "multiplicative": "bilinear",
    "additive": "concat",
    "mlp": "concat",
    "bahdanau": "concat",
    "luong": "dot",
    "scaled": "scaled_dot",
}


@dataclass(frozen=True)
class CorpusConfig:
    """One parallel corpus: where it is, how it is stored, which splits it gives."""

    name: str = _opt(
        "", help="the corpus's name in reports and split names; default: its folder's name"
    )
    dir: str = _opt(
        "", help="its folder under data.root (an absolute path as it is); default: its name"
    )
    format: Literal["text", "tsv", "jsonl", "hub"] = _opt(
        "text",
        help="text: aligned {split}.{lang} files; tsv; jsonl; hub: a Hugging Face hub dataset",
    )
    # Split names. text: files {dir}/{split}.{lang}; tsv/jsonl: file {dir}/{split} (a path or
    # URL, absolute or relative to dir); hub: split names of the dataset `hub_name`.
    train: str = _opt(
        "train", help="the training split (a file name for tsv/jsonl, a split name for hub)"
    )
    valid: str = _opt("", help="the validation split; '' = none (or valid_size rows of train)")
    test: tuple[str, ...] = _opt((), help="the test splits")
    # Corpora shipped as one file (Tatoeba): with `valid: ""` / `test: []`, this many rows
    # of the train split are held out (a fixed random sample) as the valid / test split.
    valid_size: int = _opt(0, min=0, help="rows held out of train for validation if valid is ''")
    test_size: int = _opt(0, min=0, help="rows held out of train for testing if test is []")
    # Fields that hold the two sides in jsonl rows / hub rows (a "translation" dict field
    # is understood too: see corpus.py).
    src_field: str = _opt("en", help="the jsonl/hub field holding the source side")
    tgt_field: str = _opt("fr", help="the jsonl/hub field holding the target side")
    hub_name: str | None = _opt(None, help="the hub dataset, for format hub")
    hub_config: str | None = _opt(None, help="the hub dataset's configuration, for format hub")
    # Fetch missing files from a known public source: multi30k ({split}.{lang} text files),
    # tatoeba (manythings.org's English-X pairs as the tsv file `train`), or none.
    download: Literal["multi30k", "tatoeba", "none"] = _opt(
        "none",
        help="fetch missing files: multi30k (its public repository), tatoeba "
        "(manythings.org's export)",
    )
    weight: float = _opt(
        1.0, above=0.0, help="times each training pair is seen an epoch (fractions sampled)"
    )


# The keys of a corpus, which the single-corpus form writes directly under `data`.
CORPUS_KEYS = tuple(f.name for f in dataclasses.fields(CorpusConfig))


@dataclass(frozen=True)
class DataConfig(CorpusConfig):
    """Where the parallel corpora are and how they are cleaned and batched.

    Either one corpus, its keys (`CorpusConfig`'s: dir, format, train, ...) directly here,
    or several under `corpora`. Corpus folders are relative to `root`, which NMT_DATA_DIR
    overrides (a data root with one folder per corpus)."""

    # -- the single-corpus form: Multi30k's folder and split names as defaults
    dir: str = _opt("data/multi30k", help="the corpus folder under root (single-corpus form)")
    valid: str = _opt("val", help="the validation split (single-corpus form)")
    test: tuple[str, ...] = _opt(("test_2016_flickr",), help="the test splits (single-corpus form)")
    root: str = _opt(".", help="the data root: one folder per corpus (NMT_DATA_DIR sets it)")
    corpora: tuple[CorpusConfig, ...] = _opt(
        (), help="several corpora, each with the corpus keys above plus name and weight"
    )
    # -- for every corpus
    src_lang: str = _opt("en", help="source language: text files' suffix, translation fields' key")
    tgt_lang: str = _opt("fr", help="target language, likewise")
    # Exact duplicate training pairs (across and within corpora) are removed, and training
    # pairs whose source sentence is in a valid or test set (Tatoeba has many translations
    # of one sentence: a held-out sentence must not be trained on under another).
    dedup: bool = _opt(
        True,
        help="remove duplicate training pairs, and those whose source is in a valid/test split",
    )
    max_len: int = _opt(100, min=1, help="longest subword sequence kept, either side")
    max_len_ratio: float = _opt(
        3.0, min=1.0, help="longest/shortest side, above it a pair is dropped"
    )
    lowercase: bool = _opt(False, help="lowercase both sides")
    invented_names: float = _opt(
        0.0,
        min=0.0,
        max=4.0,
        help="copies of each training pair with a name on both sides, the name replaced by an "
        "invented one (0.5: half the pairs get one; 2: each gets two; nmt.augment: teaches "
        "copying unseen names)",
    )
    cache: bool = _opt(True, help="keep the tokenized splits in run.dir/data/ and reuse them")

    def corpus_list(self) -> tuple[CorpusConfig, ...]:
        """The corpora, each with its name and folder (under root) filled in."""
        listed = self.corpora or (CorpusConfig(**{k: getattr(self, k) for k in CORPUS_KEYS}),)
        out = []
        for i, c in enumerate(listed):
            name = c.name or (Path(c.dir).name if c.dir else f"corpus{i + 1}")
            out.append(
                dataclasses.replace(c, name=name, dir=str(Path(self.root) / (c.dir or name)))
            )
        return tuple(out)

    def key_of(self, corpus: CorpusConfig) -> str:
        """The config key under which a corpus of `corpus_list()` is written."""
        if not self.corpora:
            return "data"
        return f"data.corpora[{[c.name for c in self.corpus_list()].index(corpus.name)}]"

    @property
    def single(self) -> bool:
        """One corpus: its splits keep their own names (no `corpus/` prefix)."""
        return len(self.corpora) <= 1


@dataclass(frozen=True)
class TokenizerConfig:
    """The sentencepiece model trained on the training split."""

    type: Literal["bpe", "unigram"] = _opt("bpe", help="sentencepiece's model type")
    vocab_size: int = _opt(8000, min=16, help="subword vocabulary size (per side unless joint)")
    joint: bool = _opt(True, help="one vocabulary for both languages")
    character_coverage: float = _opt(
        1.0, min=0.9, max=1.0, help="sentencepiece's character coverage"
    )
    input_sentence_size: int = _opt(0, min=0, help="sentences sampled to train on; 0 = all")


@dataclass(frozen=True)
class ModelConfig:
    """Bidirectional-RNN encoder and attention decoder."""

    cell: Literal["gru", "lstm"] = _opt("gru", help="the RNN cell of encoder and decoder")
    emb_size: int = _opt(256, min=1, help="embedding size")
    enc_hidden: int = _opt(256, min=1, help="per direction")
    enc_layers: int = _opt(1, min=1, help="encoder layers")
    dec_hidden: int = _opt(512, min=1, help="decoder hidden size")
    dec_layers: int = _opt(1, min=1, help="decoder layers")
    attention: Literal["dot", "scaled_dot", "bilinear", "concat"] = _opt(
        "concat",
        help="scoring function (aliases: general, multiplicative -> bilinear; additive, mlp, "
        "bahdanau -> concat)",
    )
    attention_size: int | None = _opt(None, min=1, help="concat's hidden size; default dec_hidden")
    decoder: Literal["bahdanau", "luong"] = _opt(
        "bahdanau",
        help="bahdanau: attends from s_{t-1}, context into the RNN; luong: from s_t, "
        "attentional output",
    )
    input_feeding: bool = _opt(
        False, help="Luong's input feeding (the attentional output fed back)"
    )
    # linear: tanh(W [h_fwd; h_bwd]); copy: [h_fwd; h_bwd] as is (OpenNMT-py's default; needs
    # dec_hidden = 2 enc_hidden); none: zeros.
    bridge: Literal["none", "linear", "copy"] = _opt(
        "linear",
        help="decoder's first state: linear tanh(W [h_fwd; h_bwd]), copy (needs dec_hidden "
        "= 2 enc_hidden), none",
    )
    dropout: float = _opt(
        0.3, min=0.0, max=0.95, help="on embeddings, between RNN layers and before the output layer"
    )
    # default: PyTorch's per-layer initialisation (embeddings N(0, 1/E)); uniform: every
    # weight from U(-init_range, init_range), OpenNMT-py's `param_init` (its default 0.1).
    init: Literal["default", "uniform"] = _opt(
        "default",
        help="default: PyTorch's per-layer init; uniform: every weight from "
        "U(-init_range, init_range)",
    )
    init_range: float = _opt(0.1, above=0.0, help="uniform init's bound")
    tie_embeddings: bool = _opt(True, help="the output layer shares the target embedding")
    share_embeddings: bool = _opt(
        False, help="source and target embeddings shared (joint vocabulary)"
    )
    # Copy attention (pointer-generator, nmt/copy.py): a learned gate mixes the attention over
    # the source pieces into the output distribution, so names never seen come through.
    copy: bool = _opt(
        False,
        help="copy attention: a gate mixes the attention over source pieces into the output "
        "(joint vocabulary)",
    )


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, precision, stopping, validation and checkpoints."""

    seed: int = _opt(1, help="seed of initialisation, dropout and data order")
    device: str = _opt("auto", help="auto | cpu | cuda | cuda:N")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _opt(
        "auto",
        help="auto: bf16 where the hardware has it (GPU cc >= 8.0, CPU bf16 units), fp16 on "
        "older GPUs, else fp32",
    )
    threads: int | None = _opt(None, min=1, help="CPU threads for torch; default all cores")
    batch_size: int = _opt(64, min=1, help="most sentences in a batch")
    batch_tokens: int | None = _opt(None, min=1, help="most padded tokens in a batch (either side)")
    accum_steps: int = _opt(1, min=1, help="micro-batches accumulated into one update")
    max_steps: int = _opt(0, min=0, help="0 = no limit")
    max_epochs: int = _opt(30, min=0, help="0 = no limit")
    max_minutes: float | None = _opt(None, min=0.0, help="this invocation's training time budget")
    optimizer: Literal["adam", "adamw"] = _opt("adam", help="fused Adam or AdamW")
    lr: float = _opt(1e-3, min=0.0, help="learning rate")
    betas: tuple[float, float] = _opt((0.9, 0.999), help="Adam's betas")
    weight_decay: float = _opt(0.0, min=0.0, help="weight decay")
    schedule: Literal["constant", "inverse_sqrt", "linear", "cosine", "plateau"] = _opt(
        "constant", help="learning-rate schedule; plateau: cut on the validation score"
    )
    warmup_steps: int = _opt(0, min=0, help="linear warm-up updates")
    plateau_factor: float = _opt(0.5, min=0.0, max=1.0, help="plateau: the factor of each cut")
    plateau_patience: int = _opt(
        2,
        min=0,
        help="plateau: validations without gain before a cut (PyTorch cuts after patience + 1)",
    )
    min_lr: float = _opt(0.0, min=0.0, help="floor of decays and cuts")
    label_smoothing: float = _opt(0.1, min=0.0, max=1.0, help="label smoothing")
    clip_norm: float | None = _opt(1.0, above=0.0, help="gradient norm clip; null = no clipping")
    valid_every: int = _opt(0, min=0, help="validate every N steps; 0 = at the end of each epoch")
    valid_metric: Literal["bleu", "loss"] = _opt(
        "bleu", help="for the best checkpoint, early stopping and plateau"
    )
    patience: int = _opt(0, min=0, help="early stopping after N validations without gain; 0 = off")
    log_every: int = _opt(50, min=1, help="updates between log lines")
    keep_last: int = _opt(3, min=1, help="step-N.pt checkpoints kept")
    average_last: int = _opt(
        0, min=0, help="at the end, average the last N step checkpoints into averaged.pt; 0 = off"
    )
    max_bad_steps: int = _opt(
        100, min=1, help="stop after N updates in a row skipped for inf/NaN gradients"
    )
    save_every_minutes: float | None = _opt(
        10.0, above=0.0, help="also write last.pt this often; null = at validation only"
    )
    dist_timeout_minutes: float = _opt(
        120.0,
        above=0.0,
        help="torchrun: how long a process waits for the others (rank 0 preparing data alone)",
    )


@dataclass(frozen=True)
class DecodeConfig:
    """Greedy / beam search settings for validation, `nmt translate` and `nmt eval`."""

    beam: int = _opt(5, min=1, help="beam size; 1 = greedy")
    length_penalty: Literal["none", "average", "gnmt"] = _opt(
        "gnmt", help="none | average (per token) | gnmt: ((5 + len) / 6) ** alpha"
    )
    alpha: float = _opt(0.6, min=0.0, help="gnmt length penalty's alpha")
    max_len_ratio: float = _opt(
        2.0, min=0.0, help="longest output: max_len_ratio x source length + max_len_const"
    )
    max_len_const: int = _opt(10, min=0, help="see max_len_ratio")
    min_len: int = _opt(0, min=0, help="shortest output (EOS forbidden before)")
    batch_size: int = _opt(64, min=1, help="sentences decoded together")


@dataclass(frozen=True)
class RunConfig:
    """Where a run writes: resolved config, tokenizer, logs, checkpoints."""

    dir: str | None = _opt(
        None, help="where a run writes: config, tokenizer, logs, checkpoints; default runs/<name>"
    )
    tensorboard: bool = _opt(True, help="TensorBoard logs in run.dir/tensorboard")


@dataclass(frozen=True)
class Config:
    name: str = _opt("nmt", help="the run's name (runs/NAME); default: the config file's name")
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()
    run: RunConfig = RunConfig()

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir if self.run.dir is not None else Path("runs") / self.name)

    def to_dict(self) -> dict[str, Any]:
        out = _plain(dataclasses.asdict(self))
        # one of the two forms of `data`: the corpus list, or one corpus's keys in place
        for key in CORPUS_KEYS if self.data.corpora else ("corpora",):
            del out["data"][key]
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively, so YAML/JSON stay plain."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- validation


def type_name(tp: Any) -> str:
    """How a type is named in error messages and the configuration reference."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(type_name(a) for a in options) + " or null"
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {type_name(args[0])}"
        return f"a list of {len(args)} " + "/".join(type_name(a) for a in args)
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _show(value: Any, limit: int = 60) -> str:
    """`repr(value)` for an error message, cut to `limit` characters: a value can be huge
    (a YAML file that expands, a pasted corpus) and the message stays one readable line."""
    return _cut(repr(value), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()
# What each scalar type accepts from YAML (bool is an int in Python, so it is kept apart).
_SCALARS: dict[Any, tuple[type, ...]] = {
    bool: (bool,),
    int: (int,),
    float: (int, float),
    str: (str, int, float),
}


def _coerce(value: Any, tp: Any, path: str, problems: list[str]) -> Any:
    """Check `value` against type `tp`; return the converted value or _MISSING."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        sub: list[str] = []
        for a in options:
            out = _coerce(value, a, path, sub)
            if out is not _MISSING:
                return out
        problems.append(f"{path}: expected {type_name(tp)}, got {_show(value)}")
        return _MISSING
    if origin is Literal:
        choices = get_args(tp)
        if isinstance(value, str) and value.lower() in choices:
            return value.lower()
        problems.append(
            f"{path}: {_show(value)} is not allowed; expected one of {', '.join(choices)}"
        )
        return _MISSING
    if origin is tuple:
        args = get_args(tp)
        if isinstance(value, str) and len(args) == 2 and args[1] is Ellipsis:
            value = (value,)  # a single split name is a list of one
        if not isinstance(value, (list, tuple)):
            problems.append(f"{path}: expected {type_name(tp)}, got {_show(value)}")
            return _MISSING
        item_types = [args[0]] * len(value) if args[1:] == (Ellipsis,) else list(args)
        if len(item_types) != len(value):
            problems.append(f"{path}: expected {type_name(tp)}, got {len(value)} items")
            return _MISSING
        items = [
            _build(typing.cast(type, t), v, f"{path}[{i}]", problems)
            if dataclasses.is_dataclass(t)
            else _coerce(v, t, f"{path}[{i}]", problems)
            for i, (v, t) in enumerate(zip(value, item_types, strict=True))
        ]
        return _MISSING if any(i is _MISSING for i in items) else tuple(items)
    accepts = _SCALARS.get(tp)
    bool_mixup = isinstance(value, bool) and tp is not bool
    if accepts is not None and isinstance(value, accepts) and not bool_mixup:
        if tp is float and not math.isfinite(
            typing.cast(float, value)
        ):  # .nan, .inf: every use would misbehave
            problems.append(f"{path}: expected a finite number, got {_show(value)}")
            return _MISSING
        return tp(value)
    problems.append(f"{path}: expected {type_name(tp)}, got {_show(value)}")
    return _MISSING


# Keys renamed since a release; checkpoints store their config, so old names still load.
RENAMED = {"train.max_skipped_steps": "max_bad_steps"}


def _build(cls: type, raw: Any, path: str, problems: list[str]) -> Any:
    """Build dataclass `cls` from a mapping, collecting problems instead of raising."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{path or 'config'}: expected a mapping of keys, got {_show(raw)}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key_path in RENAMED:
            key = RENAMED[key_path]
        if key not in fields:
            near = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            allowed = ", ".join(fields)
            problems.append(f"{_cut(key_path, 80)}: unknown key{hint}; known keys: {allowed}")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(typing.cast(type, tp), value, key_path, problems)
            continue
        if key == "attention" and isinstance(value, str):
            value = ATTENTION_ALIASES.get(value.lower(), value)
        out = _coerce(value, tp, key_path, problems)
        if out is _MISSING:
            continue
        meta = fields[key].metadata
        lo, hi, above = meta.get("min"), meta.get("max"), meta.get("above")
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            if lo is not None and out < lo:
                problems.append(f"{key_path}: {out} is below the minimum {lo}")
                continue
            if above is not None and out <= above:
                off = " (null turns it off)" if out == above and fields[key].default else ""
                problems.append(f"{key_path}: {out} must be above {above}{off}")
                continue
            if hi is not None and out > hi:
                problems.append(f"{key_path}: {out} is above the maximum {hi}")
                continue
        kwargs[key] = out
    return cls(**kwargs)


DEVICES = "auto, cpu, cuda or cuda:N"


def is_device_name(name: str) -> bool:
    """auto | cpu | cuda | cuda:N (the config key train.device and the --device flags)."""
    return name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit())


def _cross_checks(cfg: Config) -> list[str]:
    """Rules that involve more than one key."""
    problems = []
    m, d = cfg.model, cfg.data
    if cfg.name in ("", ".", "..") or any(c in cfg.name for c in "/\\\0"):
        problems.append(
            f"name: {_show(cfg.name)} must be a plain name (no '/', not '.' or '..'): "
            "the run directory is runs/NAME"
        )
    if m.share_embeddings and not cfg.tokenizer.joint:
        problems.append("model.share_embeddings: needs tokenizer.joint: true (one vocabulary)")
    if m.copy and not cfg.tokenizer.joint:
        problems.append(
            "model.copy: needs tokenizer.joint: true (source pieces are copied as target pieces)"
        )
    if m.input_feeding and m.decoder != "luong":
        problems.append("model.input_feeding: only the luong decoder feeds its output back")
    if m.bridge == "copy" and m.dec_hidden != 2 * m.enc_hidden:
        problems.append(
            f"model.bridge: copy needs dec_hidden = 2 x enc_hidden ({2 * m.enc_hidden}), "
            f"got {m.dec_hidden}; use linear"
        )
    if cfg.train.average_last > cfg.train.keep_last:
        problems.append(
            f"train.average_last: {cfg.train.average_last} checkpoints to average, but only "
            f"train.keep_last = {cfg.train.keep_last} are kept; raise keep_last"
        )
    problems += _corpora_checks(d)
    if cfg.train.max_steps == 0 and cfg.train.max_epochs == 0 and cfg.train.max_minutes is None:
        problems.append("train: set at least one of max_steps, max_epochs, max_minutes")
    if not is_device_name(cfg.train.device):
        problems.append(
            f"train.device: {_show(cfg.train.device)} is not allowed; expected {DEVICES}"
        )
    return problems


def _corpora_checks(d: DataConfig) -> list[str]:
    problems = []
    if d.corpora:
        flat = DataConfig()
        mixed = [k for k in CORPUS_KEYS if getattr(d, k) != getattr(flat, k)]
        if mixed:
            problems.append(
                f"data.{mixed[0]}: with data.corpora, each corpus gives its own "
                f"{', '.join(mixed)} (data.corpora[i].{mixed[0]})"
            )
    corpora = d.corpus_list()
    where = [f"data.corpora[{i}]" for i in range(len(corpora))] if d.corpora else ["data"]
    names = [c.name for c in corpora]
    for at, c in zip(where, corpora, strict=True):
        if names.count(c.name) > 1:
            problems.append(f"{at}.name: {_show(c.name)} names two corpora; give each its own name")
        if c.format == "hub" and not c.hub_name:
            problems.append(f"{at}.hub_name: required when format is 'hub'")
        if "/" in c.name:
            problems.append(f"{at}.name: {_show(c.name)} must not contain '/'")
    if not any(c.valid or c.valid_size for c in corpora):
        problems.append(
            "data.valid: no corpus names a validation split; name one, or set valid_size "
            "to hold rows of a train split out for validation"
        )
    return problems


# --------------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (`*name`): a config has no need to repeat a
    node, and aliases of aliases expand exponentially (400 bytes to 52 MB and 350 MB of
    memory: the "billion laughs"), which a loader must refuse before building them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{_cut(event.anchor, 30)}) are not allowed",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (["a", "b"], value parsed as YAML)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            [f"--set {_show(text)}: expected KEY=VALUE, e.g. train.lr=0.0005"], "--set"
        )
    parts = key.strip().split(".")
    if any(not p for p in parts):
        raise ConfigError([f"--set {_show(text)}: malformed key {_show(key)}"], "--set")
    try:
        parsed = _load_yaml(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return parts, parsed


def _apply(raw: dict[str, Any], parts: list[str], value: Any) -> None:
    node = raw
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = value


def config_from_dict(
    raw: dict[str, Any],
    overrides: Sequence[str] = (),
    source: str = "config",
) -> Config:
    """Validate a plain mapping (plus `--set` overrides) into a `Config`."""
    raw = dict(raw)
    for text in overrides:
        parts, value = parse_override(text)
        _apply(raw, parts, value)
    problems: list[str] = []
    cfg = _build(Config, raw, "", problems)
    if not problems:
        problems = _cross_checks(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config; `NMT_DATA_DIR` overrides data.root, `--set` overrides both."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"file not found: {path}"], str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"cannot read: {e}"], str(path)) from None
    try:
        raw = _load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{where}invalid YAML ({problem})"], str(path)) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(["expected a mapping of sections at the top level"], str(path))
    raw.setdefault("name", path.stem)
    env_dir = os.environ.get(DATA_DIR_ENV)
    if env_dir:
        data = raw.get("data")
        raw["data"] = {**(data if isinstance(data, dict) else {}), "root": env_dir}
    return config_from_dict(raw, overrides, str(path))
