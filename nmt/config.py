"""Configuration: the schema of a run, and `load_config`.

Every key a run understands is declared once here, with its type, default, allowed range and
help (the configuration reference, docs/configuration.md, is generated from it). Checking a
mapping against the schema is `nmt.typed`'s job; what is particular to nmt's keys (aliases of
scoring functions, renamed keys, the one-corpus spelling of `data`, rules across keys) is
here. Standard library + PyYAML only, so `nmt check-config` stays fast.
"""

# long: the schema is one table, a dataclass per section and a help text per key, read
# top to bottom; the generic checking is in nmt/typed.py.

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.files import FileError, read_small, stands_in
from nmt.typed import (
    ConfigError,
    apply_override,
    build,
    parse_override,
    plain,
    show,
)
from nmt.typed import option as _opt
from nmt.yaml_loader import load_yaml

DATA_DIR_ENV = "NMT_DATA_DIR"
# A config is a page of YAML (the reference one is 2 KB); a file or a device giving more is
# not one, and is refused before it fills memory.
CONFIG_MAX_BYTES = 1 << 20


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


# The keys of a corpus: the one-corpus spelling of `data` writes them directly under `data`.
CORPUS_KEYS = tuple(f.name for f in dataclasses.fields(CorpusConfig))
# What that spelling means when it leaves them out: Multi30k's folder and split names (and
# the default `corpora`, below).
_M30K_DIR, _M30K_VALID, _M30K_TEST = "data/multi30k", "val", ("test_2016_flickr",)
ONE_CORPUS_DEFAULTS = {"dir": _M30K_DIR, "valid": _M30K_VALID, "test": list(_M30K_TEST)}


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel corpora are and how they are cleaned and batched.

    Corpora are listed under `corpora`; one corpus may also be written with its keys
    (`CorpusConfig`'s: dir, format, train, ...) directly under `data`, which loading rewrites
    into a list of one (`_one_corpus`). Corpus folders are relative to `root`, which
    NMT_DATA_DIR overrides (a data root with one folder per corpus)."""

    root: str = _opt(".", help="the data root: one folder per corpus (NMT_DATA_DIR sets it)")
    corpora: tuple[CorpusConfig, ...] = _opt(
        (CorpusConfig(dir=_M30K_DIR, valid=_M30K_VALID, test=_M30K_TEST),),
        help="the corpora, each with the corpus keys below; one corpus may be written with its "
        "keys directly under data (dir, valid and test then default to Multi30k's)",
    )
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
        out = []
        for i, c in enumerate(self.corpora):
            name = c.name or (Path(c.dir).name if c.dir else f"corpus{i + 1}")
            out.append(
                dataclasses.replace(c, name=name, dir=str(Path(self.root) / (c.dir or name)))
            )
        return tuple(out)

    def key_of(self, corpus: CorpusConfig) -> str:
        """The config key of a corpus of `corpus_list()` in messages (a lone corpus: `data`,
        its most common spelling)."""
        if self.single:
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
    # Luong's local attention and multi-head attention (nmt/local_attention.py, nmt/multihead.py)
    attention_scope: Literal["global", "local_m", "local_p"] = _opt(
        "global",
        help="global: every source position; local_m: a window around p_t = t; local_p: "
        "around a predicted p_t, Gaussian-weighted",
    )
    attention_window: int = _opt(10, min=1, help="local attention's D: positions either side")
    attention_heads: int = _opt(
        1,
        min=1,
        help="attention heads (1: one scorer, as ever); must divide dec_hidden, 2 x enc_hidden",
    )
    decoder: Literal["bahdanau", "luong"] = _opt(
        "bahdanau",
        help="bahdanau: attends from s_{t-1}, context into the RNN; luong: from s_t, "
        "attentional output",
    )
    input_feeding: bool = _opt(
        False, help="Luong's input feeding (the attentional output fed back)"
    )
    # Where input feeding's h̃ is dropped: OpenNMT-py drops it once, and the dropped h̃ is both
    # the output layer's input and the next step's (Joey NMT drops the attentional layer's
    # input, so what it feeds back carries dropout too); without it only the output layer's
    # input is, and the fed-back h̃ is clean.
    feed_dropout: bool = _opt(
        False,
        help="input feeding: h̃ dropped once, for the output layer and the next step alike "
        "(OpenNMT-py's placement); false: only the output layer's input",
    )
    # tanh: Luong's h̃ = tanh(W_c [c; s]); linear: W_c [c; s] + b, what OpenNMT-py's mlp
    # (concat) attention emits (its GlobalAttention applies tanh for dot/general only).
    attention_output: Literal["tanh", "linear"] = _opt(
        "tanh",
        help="luong decoder's attentional output: tanh(W_c [c; s]) (Luong), or linear "
        "W_c [c; s] + b (OpenNMT-py's mlp attention)",
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
    schedule: Literal["constant", "inverse_sqrt", "linear", "cosine", "plateau", "step"] = _opt(
        "constant",
        help="learning-rate schedule; plateau: cut on the validation score; step: cut by "
        "decay_factor every decay_every updates from update decay_start",
    )
    warmup_steps: int = _opt(0, min=0, help="linear warm-up updates")
    # `step` is OpenNMT-py's decay (start_decay_steps, decay_steps, learning_rate_decay, with
    # its defaults): the rate is cut a first time at update decay_start, then every
    # decay_every updates.
    decay_start: int = _opt(50000, min=1, help="step: the first update run at the cut rate")
    decay_every: int = _opt(10000, min=1, help="step: updates between cuts")
    decay_factor: float = _opt(0.5, min=0.0, max=1.0, help="step: the factor of each cut")
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
    exponential_smoothing: float = _opt(
        0.0,
        min=0.0,
        max=1.0,
        help="validate, save and decode a running average of the weights: each update's "
        "weight in it, at least 9/(step + 10) (Marian's exponential-smoothing, OpenNMT-py's "
        "average_decay; 1e-4 is theirs); 0 = off",
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
    link_latest: bool = _opt(
        True,
        help="point runs/latest (the model translate, eval and serve use without --model) "
        "at this run when it ends; false for a run a script makes on the side",
    )


@dataclass(frozen=True)
class Config:
    name: str = _opt(
        "nmt", help="the run's name (runs/NAME); default: the config file's name (nmt for a pipe)"
    )
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
        return plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


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
            f"name: {show(cfg.name)} must be a plain name (no '/', not '.' or '..'): "
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
    if m.feed_dropout and not m.input_feeding:
        problems.append("model.feed_dropout: drops the fed-back h̃; needs model.input_feeding: true")
    if m.attention_output != "tanh" and m.decoder != "luong":
        problems.append(
            "model.attention_output: only the luong decoder has an attentional output; "
            "bahdanau's pre-output is tanh"
        )
    problems += _heads_checks(m)
    if m.bridge == "copy" and m.dec_hidden != 2 * m.enc_hidden:
        problems.append(
            f"model.bridge: copy needs dec_hidden = 2 x enc_hidden ({2 * m.enc_hidden}), "
            f"got {m.dec_hidden}; use linear"
        )
    t = cfg.train
    if t.min_lr > t.lr and t.schedule in ("linear", "cosine", "plateau", "step"):
        problems.append(  # linear, cosine and step would rise above lr; plateau never cut
            f"train.min_lr: {t.min_lr} is above train.lr ({t.lr}); the {t.schedule} "
            "schedule's floor must be at most the rate"
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
            f"train.device: {show(cfg.train.device)} is not allowed; expected {DEVICES}"
        )
    return problems


def heads_problems(heads: int, sizes: dict[str, int]) -> list[str]:
    """Each head takes an equal slice of the query, the encoder states and concat's units:
    `sizes` names each width the heads split."""
    return [
        f"model.attention_heads: {heads} heads must divide {name} ({size})"
        for name, size in sizes.items()
        if size % heads
    ]


def _heads_checks(m: ModelConfig) -> list[str]:
    sizes = {"dec_hidden": m.dec_hidden, "2 x enc_hidden": 2 * m.enc_hidden}
    if m.attention == "concat":
        sizes["attention_size"] = m.attention_size or m.dec_hidden
    return heads_problems(m.attention_heads, sizes)


def _corpora_checks(d: DataConfig) -> list[str]:
    corpora = d.corpus_list()
    if not corpora:
        return ["data.corpora: no corpus; list at least one"]
    where = [f"data.corpora[{i}]" for i in range(len(corpora))]
    names = [c.name for c in corpora]
    problems = []
    for at, c in zip(where, corpora, strict=True):
        if names.count(c.name) > 1:
            problems.append(f"{at}.name: {show(c.name)} names two corpora; give each its own name")
        if c.format == "hub" and not c.hub_name:
            problems.append(f"{at}.hub_name: required when format is 'hub'")
        if "/" in c.name:
            problems.append(f"{at}.name: {show(c.name)} must not contain '/'")
    if not any(c.valid or c.valid_size for c in corpora):
        problems.append(
            "data.valid: no corpus names a validation split; name one, or set valid_size "
            "to hold rows of a train split out for validation"
        )
    return problems


# --------------------------------------------------------------------------- loading

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
NORMALISE = {
    "model.attention": lambda v: ATTENTION_ALIASES.get(v.lower(), v) if isinstance(v, str) else v
}
# Keys renamed since a release; checkpoints store their config, so old names still load.
RENAMED = {"train.max_skipped_steps": "max_bad_steps"}


def _one_corpus(raw: dict[str, Any]) -> tuple[bool, list[str]]:
    """Rewrite, in place, the one-corpus spelling of `data` (the corpus keys directly under
    it) into `corpora: [...]`, with Multi30k's folder and splits where it leaves them out.
    Returns whether it did (problems then name `data.KEY`, as written), and the problem of a
    `data` that mixes both spellings."""
    data = raw.get("data", {})
    if not isinstance(data, dict):
        return False, []
    given = [k for k in CORPUS_KEYS if k in data]
    rest = {k: v for k, v in data.items() if k not in given}
    if "corpora" in data:
        raw["data"] = rest  # the keys in the wrong place are said once, below
        if not given:
            return False, []
        return False, [
            f"data.{given[0]}: with data.corpora, each corpus gives its own "
            f"{', '.join(given)} (data.corpora[i].{given[0]})"
        ]
    corpus = ONE_CORPUS_DEFAULTS | {k: data[k] for k in given}
    raw["data"] = rest | {"corpora": [corpus]}
    return True, []


def apply_data_dir_env(raw: dict[str, Any]) -> dict[str, Any]:
    """The rule of NMT_DATA_DIR: when set, it replaces data.root (a config being loaded, or a
    checkpoint's config being evaluated on this machine's data). `--set` comes after it."""
    env_dir = os.environ.get(DATA_DIR_ENV)
    if not env_dir:
        return raw
    data = raw.get("data")
    return {**raw, "data": {**(data if isinstance(data, dict) else {}), "root": env_dir}}


def config_from_dict(
    raw: dict[str, Any],
    overrides: Sequence[str] = (),
    source: str = "config",
) -> Config:
    """Validate a plain mapping (plus `--set` overrides) into a `Config`."""
    raw = dict(raw)
    for text in overrides:
        parts, value = parse_override(text)
        apply_override(raw, parts, value)
    rewritten, problems = _one_corpus(raw)
    cfg, found = build(Config, raw, renamed=RENAMED, normalise=NORMALISE)
    problems += found
    if not problems:
        problems = _cross_checks(cfg)
    if problems:
        if rewritten:
            problems = [p.replace("data.corpora[0].", "data.") for p in problems]
        raise ConfigError(problems, source)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Config:
    """Read a YAML config; `NMT_DATA_DIR` overrides data.root, `--set` overrides both."""
    path = Path(path)
    try:
        text = read_small(path, CONFIG_MAX_BYTES, "a config file").decode("utf-8")
    except FileError as e:
        raise ConfigError([str(e)], str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"not UTF-8 text (byte {e.start})"], str(path)) from None
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError([f"{where}invalid YAML ({problem})"], str(path)) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(["expected a mapping of sections at the top level"], str(path))
    if stands_in(path) is None:  # a pipe (`<(sed ...)`) has no name to give a run: "63"
        raw.setdefault("name", path.stem)
    return config_from_dict(apply_data_dir_env(raw), overrides, str(path))
