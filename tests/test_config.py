"""Config loading: each kind of error, overrides, the data-dir environment variable."""

from __future__ import annotations

import copy
import re
import subprocess

import pytest
from train_setup import ROOT, TINY

from nmt.config import (
    CONFIG_MAX_BYTES,
    DATA_DIR_ENV,
    Config,
    ConfigError,
    config_from_dict,
    load_config,
    parse_override,
)
from nmt.typed import load_yaml


def problems_of(raw: dict, overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, list(overrides))
    return info.value.problems


def test_defaults_are_a_valid_config():
    cfg = config_from_dict({})
    assert cfg == Config()
    assert cfg.model.attention == "concat"


def test_unknown_key_suggests_the_close_one():
    (problem,) = problems_of({"model": {"atention": "dot"}})
    assert problem.startswith("model.atention: unknown key (did you mean 'attention'?)")


def test_unknown_section_is_reported():
    (problem,) = problems_of({"trian": {}})
    assert "trian: unknown key (did you mean 'train'?)" in problem


def test_wrong_type_names_path_and_expectation():
    (problem,) = problems_of({"train": {"lr": "fast"}})
    assert problem == "train.lr: expected a number, got 'fast'"


def test_bool_is_not_an_integer():
    (problem,) = problems_of({"train": {"max_steps": True}})
    assert problem.startswith("train.max_steps: expected an integer")


def test_out_of_range_number():
    (problem,) = problems_of({"model": {"dropout": 1.5}})
    assert problem == "model.dropout: 1.5 is above the maximum 0.95"


def test_invalid_choice_lists_the_allowed_ones():
    (problem,) = problems_of({"model": {"attention": "cosine"}})
    assert "model.attention: 'cosine' is not allowed" in problem
    assert "dot, scaled_dot, bilinear, concat" in problem


def test_a_copy_bridge_needs_a_decoder_twice_the_encoder_size():
    (problem,) = problems_of({"model": {"bridge": "copy", "enc_hidden": 256, "dec_hidden": 256}})
    assert problem.startswith("model.bridge: copy needs dec_hidden = 2 x enc_hidden (512)")
    cfg = config_from_dict({"model": {"bridge": "copy", "enc_hidden": 256, "dec_hidden": 512}})
    assert cfg.model.bridge == "copy"


def test_all_problems_are_reported_together():
    found = problems_of(
        {"model": {"atention": "dot", "cell": "rnn"}, "train": {"lr": "x", "max_steps": -1}}
    )
    assert len(found) == 4
    assert {p.split(":")[0] for p in found} == {
        "model.atention",
        "model.cell",
        "train.lr",
        "train.max_steps",
    }


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("general", "bilinear"),
        ("multiplicative", "bilinear"),
        ("additive", "concat"),
        ("mlp", "concat"),
        ("bahdanau", "concat"),
        ("scaled_dot", "scaled_dot"),
        ("DOT", "dot"),
    ],
)
def test_attention_aliases(alias, canonical):
    assert config_from_dict({"model": {"attention": alias}}).model.attention == canonical


def test_cross_checks():
    found = problems_of({"model": {"input_feeding": True, "decoder": "bahdanau"}})
    assert found[0].startswith("model.input_feeding:")
    found = problems_of({"model": {"attention_output": "linear", "decoder": "bahdanau"}})
    assert found[0].startswith("model.attention_output:")
    found = problems_of({"model": {"feed_dropout": True, "decoder": "luong"}})
    assert found[0].startswith("model.feed_dropout:") and "input_feeding" in found[0]
    found = problems_of({"train": {"device": "tpu"}})
    assert found[0].startswith("train.device:")


def test_list_and_tuple_fields():
    cfg = config_from_dict({"data": {"test": "test_2016_flickr"}, "train": {"betas": [0.9, 0.98]}})
    assert cfg.data.corpora[0].test == ("test_2016_flickr",)
    assert cfg.train.betas == (0.9, 0.98)
    (problem,) = problems_of({"train": {"betas": [0.9]}})
    assert problem.startswith("train.betas: expected a list of 2")


@pytest.mark.parametrize(
    ("text", "parts", "value"),
    [
        ("train.lr=0.0005", ["train", "lr"], 0.0005),
        ("model.attention=dot", ["model", "attention"], "dot"),
        ("train.max_minutes=null", ["train", "max_minutes"], None),
        ("model.input_feeding=true", ["model", "input_feeding"], True),
        ("data.test=[a, b]", ["data", "test"], ["a", "b"]),
        ("run.dir=runs/x=y", ["run", "dir"], "runs/x=y"),
    ],
)
def test_parse_override(text, parts, value):
    assert parse_override(text) == (parts, value)


@pytest.mark.parametrize("bad", ["train.lr", "=3", "train..lr=1"])
def test_malformed_override(bad):
    with pytest.raises(ConfigError):
        parse_override(bad)


def test_overrides_are_type_checked_like_the_file():
    cfg = config_from_dict({}, ["train.lr=0.01", "model.attention=general"])
    assert cfg.train.lr == 0.01
    assert cfg.model.attention == "bilinear"
    (problem,) = problems_of({}, ["train.max_steps=many"])
    assert problem.startswith("train.max_steps: expected an integer")
    (problem,) = problems_of({}, ["train.lrr=1"])
    assert "did you mean 'lr'" in problem


def test_a_number_in_exponent_form_is_a_number_where_a_number_is_expected(tmp_path):
    """`lr: 1e-4` is how configs spell a learning rate; PyYAML (YAML 1.1) reads it as a
    string. A number field takes it as the number; a string field keeps the text."""
    path = tmp_path / "run.yaml"
    path.write_text("name: 1e5\ntrain:\n  lr: 1e-4\n  min_lr: 2E-6\n  decay_factor: .5\n")
    cfg = load_config(path, ["train.betas=[0.9, 9.8e-1]", "train.plateau_factor=+5e-1"])
    assert (cfg.train.lr, cfg.train.min_lr, cfg.train.decay_factor) == (1e-4, 2e-6, 0.5)
    assert cfg.train.betas == (0.9, 0.98) and cfg.train.plateau_factor == 0.5
    assert cfg.name == "1e5"
    assert problems_of({}, ["train.lr=-1e-4"]) == ["train.lr: -1e-4 is below the minimum 0"]
    assert problems_of({}, ["train.lr=1e999"])[0].startswith("train.lr: expected a finite")
    for not_a_number in ("1e", "e4", "1e-4x", "1e-4.5", "1e 4"):
        (problem,) = problems_of({}, [f"train.lr={not_a_number}"])
        assert problem.startswith("train.lr: expected a number"), not_a_number
    (problem,) = problems_of({}, ["train.max_steps=1e4"])  # a whole number stays one
    assert problem.startswith("train.max_steps: expected an integer")


def test_yaml_1_1_words_and_numbers_are_read_as_the_field_expects(tmp_path):
    """PyYAML reads YAML 1.1: `no` is False (Norwegian's code), `1.50` is 1.5, a date is a
    datetime. A string field keeps the text as written; a bool or number field the value."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "name: 2026-11-29\ndata:\n  src_lang: no\n  tgt_lang: 1.50\n"
        "  lowercase: on\n  cache: no\nmodel:\n  tie_embeddings: off\ntrain:\n  max_steps: 0x10\n"
    )
    cfg = load_config(path, ["run.dir=off", "train.lr=5E-4"])
    assert (cfg.name, cfg.data.src_lang, cfg.data.tgt_lang) == ("2026-11-29", "no", "1.50")
    assert (cfg.data.lowercase, cfg.data.cache, cfg.model.tie_embeddings) == (True, False, False)
    assert (cfg.run.dir, cfg.train.max_steps, cfg.train.lr) == ("off", 16, 5e-4)
    assert type(cfg.train.lr) is float and type(cfg.train.max_steps) is int
    copied = copy.deepcopy(load_yaml("a: 1.50\nb: no"))  # a copy keeps the text too
    assert copied == {"a": 1.5, "b": "no"} and (repr(copied["a"]), repr(copied["b"])) == (
        "1.50",
        "'no'",
    )
    path.write_text(
        "train:\n  lr: '1e-4'\n  max_steps: 1e4\n  valid_metric: no\nmodel:\n  dropout: off\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert sorted(info.value.problems) == [
        "model.dropout: expected a number, got 'off'",
        "train.lr: expected a number, got '1e-4'",  # quoted is text, as '0.5' is
        "train.max_steps: expected an integer, got 1e4",  # shown as written
        "train.valid_metric: 'no' is not allowed; expected one of bleu, loss",
    ]
    path.write_text("train:\n  max_steps: " + "9" * 5000 + "\n")  # past Python's 4,300 digits
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        "line 2, column 14: invalid YAML (a number of 5,000 characters is too long to read)"
    ]


def test_a_number_yaml_1_1_and_yaml_1_2_read_apart_is_refused_with_both(tmp_path):
    """YAML 1.1 reads `010` as octal 8 and `1:30` as 90 (base 60); YAML 1.2 as 10 and text.
    A number key refuses them, naming both readings; a text key keeps the text. Where the two
    agree (`007`, `0x10`, `00`) or the form is YAML 1.2's own (`0o17`), the number is taken."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "name: 010\ndata:\n  src_lang: 1:30\ntrain:\n  max_steps: 010\n  valid_every: 1:30\n"
        "  lr: 1:30.5\n  log_every: -0_10\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert sorted(info.value.problems) == [
        "train.log_every: -0_10 is octal -8 in YAML 1.1 and -10 in YAML 1.2; write -10, or "
        "-0o10 for octal",
        "train.lr: 1:30.5 is 90.5 in YAML 1.1 (base 60) and text in YAML 1.2; write the number "
        "you mean",
        "train.max_steps: 010 is octal 8 in YAML 1.1 and 10 in YAML 1.2; write 10, or 0o10 for "
        "octal",
        "train.valid_every: 1:30 is 90 in YAML 1.1 (base 60) and text in YAML 1.2; write the "
        "number you mean",
    ]
    path.write_text("name: 010\ndata:\n  src_lang: 1:30\ntrain:\n  max_steps: 007\n")
    cfg = load_config(path, ["train.valid_every=0o17", "train.log_every=0x10", "train.seed=00"])
    assert (cfg.name, cfg.data.src_lang) == ("010", "1:30")
    assert (cfg.train.max_steps, cfg.train.valid_every, cfg.train.log_every) == (7, 15, 16)
    assert cfg.train.seed == 0
    (problem,) = problems_of({}, ["train.max_steps=010"])  # --set reads the same way
    assert problem.startswith("train.max_steps: 010 is octal 8 in YAML 1.1")


def test_overrides_leave_the_callers_mapping_as_it_was():
    raw = {"train": {"lr": 0.01}, "model": {"dropout": 0.1}}
    cfg = config_from_dict(raw, ["train.lr=0.5", "model.dropout=0.3"])
    assert (cfg.train.lr, cfg.model.dropout) == (0.5, 0.3)
    assert raw == {"train": {"lr": 0.01}, "model": {"dropout": 0.1}}


def test_a_floor_above_the_rate_is_refused():
    (problem,) = problems_of({"train": {"schedule": "step", "lr": 1e-3, "min_lr": 1e-2}})
    assert problem == (
        "train.min_lr: 0.01 is above train.lr (0.001); the step schedule's floor must be at "
        "most the rate"
    )
    assert config_from_dict({"train": {"lr": 1e-3, "min_lr": 1e-2}}).train.min_lr == 1e-2


def test_load_config_file_env_and_override_precedence(tmp_path, monkeypatch):
    path = tmp_path / "my_run.yaml"
    path.write_text("data:\n  root: from_file\n  dir: m30k\nmodel:\n  attention: dot\n")
    cfg = load_config(path)
    assert cfg.name == "my_run"
    assert str(cfg.run_dir) == "runs/my_run"
    assert cfg.data.corpus_list()[0].dir == "from_file/m30k"
    monkeypatch.setenv(DATA_DIR_ENV, "from_env")  # NMT_DATA_DIR names the data root
    assert load_config(path).data.corpus_list()[0].dir == "from_env/m30k"
    assert load_config(path, ["data.root=from_set"]).data.corpus_list()[0].dir == "from_set/m30k"
    # an absolute corpus folder ignores the root
    assert load_config(path, ["data.dir=/abs/m30k"]).data.corpus_list()[0].dir == "/abs/m30k"


def test_corpora_list_names_folders_and_checks(tmp_path):
    cfg = config_from_dict(
        {
            "data": {
                "root": "r",
                "corpora": [
                    {"name": "a", "valid": "val", "weight": 2},
                    {"dir": "b_folder", "format": "tsv", "train": "b.tsv", "valid_size": 3},
                ],
            }
        }
    )
    a, b = cfg.data.corpus_list()
    assert (a.name, a.dir, a.weight) == ("a", "r/a", 2.0)
    assert (b.name, b.dir, b.format) == ("b_folder", "r/b_folder", "tsv")
    assert not cfg.data.single
    problems = [
        ({"corpora": [{"name": "x", "valid": "v"}, {"name": "x"}]}, "'x' names two corpora"),
        ({"corpora": [{"name": "x"}]}, "no corpus names a validation split"),
        ({"corpora": [{"name": "x", "valid": "v", "weight": 0}]}, r"corpora\[0\]\.weight"),
        ({"corpora": [{"name": "x", "valid": "v", "colour": 1}]}, r"corpora\[0\]\.colour"),
        ({"train": "t", "corpora": [{"name": "x", "valid": "v"}]}, "each corpus gives its own"),
        ({"corpora": [{"name": "x", "valid": "v", "format": "hub"}]}, "hub_name: required"),
        ({"corpora": "x"}, "data.corpora"),
    ]
    for data, message in problems:
        with pytest.raises(ConfigError, match=message):
            config_from_dict({"data": data})


def test_load_config_reports_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_what_stands_in_a_configs_place_is_named_and_never_read_past_the_limit(tmp_path):
    """A device or a pipe that never ends is refused at CONFIG_MAX_BYTES (before, `nmt
    check-config /dev/zero` filled 24 GB of memory); a folder, a broken link and a link loop
    are named; a pipe that ends reads as a file (process substitution)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * CONFIG_MAX_BYTES + "\n")
    cases = {
        "/dev/zero": "/dev/zero: a device giving over 1,048,576 bytes, not a config file",
        str(big): "big.yaml: over 1,048,576 bytes, not a config file",
        str(tmp_path / "folder"): "folder: a folder, not a config file",
        str(tmp_path / "broken"): "broken: a broken link, not a config file",
        str(tmp_path / "loop"): "loop: unreadable (Too many levels of symbolic links)",
    }
    for path, says in cases.items():
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_config(path)
    endless = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        with pytest.raises(ConfigError, match="a pipe giving over 1,048,576 bytes"):
            load_config(f"/dev/fd/{endless.stdout.fileno()}")
    finally:
        endless.kill()
        endless.wait()
    short = subprocess.Popen(["cat", str(ROOT / "configs/tiny.yaml")], stdout=subprocess.PIPE)
    try:
        piped = load_config(f"/dev/fd/{short.stdout.fileno()}")
        assert piped.model == load_config(TINY).model
        assert piped.name == "nmt"  # the default: not "63", the pipe's number, as it was
    finally:
        short.wait()
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 9\)"):
        load_config(tmp_path / "latin1.yaml")


def test_resolved_config_round_trips_through_yaml():
    import yaml

    cfg = config_from_dict({"model": {"attention": "dot"}, "data": {"test": ["a", "b"]}})
    assert config_from_dict(yaml.safe_load(cfg.to_yaml())) == cfg


def test_one_corpus_spelling_is_a_list_of_one_with_multi30k_defaults():
    one = config_from_dict({"data": {"dir": "m30k", "format": "text", "root": "r"}})
    listed = config_from_dict(
        {
            "data": {
                "root": "r",
                "corpora": [{"dir": "m30k", "valid": "val", "test": ["test_2016_flickr"]}],
            }
        }
    )
    assert one == listed
    assert one.data.corpora[0].valid == "val" and config_from_dict({}) == Config()
    # a stored config (a checkpoint's) loads back to the same
    assert config_from_dict(one.to_dict()) == one
    # messages name a key as it was written
    assert problems_of({"data": {"weight": 0}})[0].startswith("data.weight: 0 must be above 0 ")
    assert problems_of({"data": {"corpora": [{"dir": "x", "valid": "v", "format": "csv"}]}})[
        0
    ].startswith("data.corpora[0].format: 'csv' is not allowed")
    (problem,) = problems_of({"data": {"corpora": [{"dir": "a", "valid": "v"}], "dir": "b"}})
    assert problem.startswith("data.dir: with data.corpora, each corpus gives its own dir")
    (problem,) = problems_of({"data": {"corpora": []}})
    assert problem.startswith("data.corpora: no corpus")


def test_a_number_out_of_range_is_shown_as_written():
    """The message quotes the file (`-1`, `1.50`, `5e-1`), not the converted float, and a
    whole bound without `.0`."""
    assert problems_of({"train": {"lr": -1}}) == ["train.lr: -1 is below the minimum 0"]
    assert problems_of({}, ["model.dropout=1.50"]) == [
        "model.dropout: 1.50 is above the maximum 0.95"
    ]
    assert problems_of({}, ["train.clip_norm=-5e-1"])[0].startswith(
        "train.clip_norm: -5e-1 must be above 0"
    )
