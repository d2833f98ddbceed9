"""Write the names test set: English sentences with names no training corpus holds, their
French, and the name each one must carry over (docs/names.tsv), and score translations of it.

    python scripts/names_set.py write [--data ../shared/data]   # (re)writes docs/names.tsv
    python scripts/names_set.py write --untuned                 # docs/names_untuned.tsv
    python scripts/names_set.py score docs/names.tsv HYPS       # share of names copied
    python scripts/names_set.py model RUN_DIR [--beam 5]        # translate it, then score

Names come from many languages and scripts (Latin with diacritics, Cyrillic, Greek, Han,
Hangul, Kana, Devanagari, Arabic, Hebrew), short and long, at the start and in the middle of
sentences, some with numbers beside them; some sentences are written all in lowercase or all
in capitals. `write` drops every name that occurs, as a whole word in any case, in a corpus
the shipped configs train on (Multi30k's train split, the whole Tatoeba file), so the set
holds only names never seen. A name counts as copied when the translation holds it as a
whole word: as written in the source (lowercase sentences: lowercase or capitalised;
capitals: in capitals).

`--untuned` writes a second set from other names (UNTUNED_NAMES) through the same templates,
written once in session 13 and never tuned on: report it beside the first, do not tune on it.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
from pathlib import Path
from typing import Any

from argtypes import whole

from nmt.errors import NmtError, one_line
from nmt.files import check_output, read_lines, write_lines, write_output

NAMES = [
    # Germanic, Nordic
    "Helga", "Sigrun", "Bjørn", "Søren", "Dagmar", "Åsa", "Thorvald", "Gudrun", "Wolfram",
    # Slavic, Baltic, Hungarian, Romanian
    "Małgorzata", "Wojciech", "Zbigniew", "Jiří", "Radka", "Ágnes", "Zoltán", "Gheorghe",
    "Ioana", "Rūta", "Wojciechowski",
    # Celtic, Dutch, French, Italian, Iberian, Basque
    "Siobhán", "Niamh", "Oisín", "Tadhg", "Gwenaëlle", "Thijs", "Matthijs", "Anaïs",
    "Bastien", "Raffaella", "Iñaki", "Itziar", "Begoña", "Xabier", "Conceição", "Gonçalo",
    # African, Middle Eastern, Asian, Pacific, American (Latin script)
    "Oluwaseun", "Chiamaka", "Ngozi", "Kwabena", "Abebe", "Thandiwe", "Sipho", "Aigerim",
    "Nurlan", "Bolormaa", "Priyanka", "Raghav", "Tenzin", "Hinemoa", "Xiomara", "Yaretzi",
    "Cuauhtémoc", "Thuy", "Minjun", "Seojin",
    # Other scripts
    "Дмитрий", "Светлана", "Νίκος", "Ελένη", "王芳", "李娜", "さくら", "지민", "प्रिया",
    "فاطمة", "אביגיל",
]  # fmt: skip

UNTUNED_NAMES = [
    "Eilidh", "Ruairí", "Grzegorz", "Szczepan", "Agnieszka", "Leocádia", "Joaquín", "Eulàlia",
    "Txomin", "Ainhoa", "Mbali", "Chukwuemeka", "Adaeze", "Aroha", "Tavita", "Keoni", "Nguyễn",
    "Huong", "Batbayar", "Zhanna", "Ksenia", "Radomír", "Přemysl", "Ildikó", "Gergő", "Ľubomír",
    "Dragoș", "Şükrü", "Gülşen", "Þórdís", "Sigríður", "Eyjólfur", "Maëlys", "Perpetua",
    "Ifeoluwa", "Nomvula", "Tsegaye", "Yerlan", "Dorjsuren", "Anjali", "Siddharth", "Kiri",
    "Wairimu", "Itzel", "Xochitl", "Ulrike", "Ingeborg", "Finnur", "Oddbjørg",
    "Ольга", "Борис", "Γιώργος", "Δήμητρα", "ნინო", "สมชาย", "Արամ", "ゆうき", "서연", "张伟",
    "अर्जुन", "يوسف", "נועה",
]  # fmt: skip

TEMPLATES = [
    ("{N} ate an apple.", "{N} a mangé une pomme."),
    ("I saw {N} yesterday.", "J'ai vu {N} hier."),
    ("{N} lives in Paris.", "{N} habite à Paris."),
    ("Where is {N}?", "Où est {N} ?"),
    ("My name is {N}.", "Je m'appelle {N}."),
    ("{N} has 3 cats.", "{N} a 3 chats."),
    ("Tom and {N} are playing in the park.", "Tom et {N} jouent dans le parc."),
    ("I gave the book to {N}.", "J'ai donné le livre à {N}."),
    ("{N} is reading a newspaper.", "{N} lit un journal."),
    ("Have you met {N}?", "As-tu rencontré {N} ?"),
    ("{N} will arrive at 7 o'clock.", "{N} arrivera à 7 heures."),
    ("Tell {N} that I called.", "Dis à {N} que j'ai appelé."),
    ("{N} bought 2 tickets for the concert.", "{N} a acheté 2 billets pour le concert."),
    ("We are waiting for {N}.", "Nous attendons {N}."),
]
COLUMNS = ("en", "fr", "name", "variant")  # the set's TSV header
PER_NAME = 4  # templates per name, taken in turn: every name at the start and in the middle


def _whole(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")


def _seen_names(data: Path, names: list[str]) -> set[str]:
    """The `names` that occur in the training corpora, as whole words in any case."""
    texts = [data / "multi30k" / "train.en", data / "multi30k" / "train.fr"]
    texts.append(data / "tatoeba" / "fra-eng.tsv")
    corpus = "\n".join(line for p in texts for line in read_lines(p)).lower()
    return {n for n in names if _whole(n.lower()).search(corpus)}


def rows(names: list[str], seen: set[str]) -> list[tuple[str, str, str, str]]:
    """(English, French, name as it must come out, variant) for each sentence."""
    out = []
    names = [n for n in names if n not in seen]
    for i, name in enumerate(names):
        for j in range(PER_NAME):
            en, fr = TEMPLATES[(i * PER_NAME + j) % len(TEMPLATES)]
            en, fr = en.replace("{N}", name), fr.replace("{N}", name)
            out.append((en, fr, name, "cased"))
        en, fr = TEMPLATES[i % len(TEMPLATES)]
        if i % 2 == 0 and name.lower() != name:  # every other name: a lowercase sentence
            name_l = name.lower()
            out.append((en.replace("{N}", name_l).lower(), fr.replace("{N}", name_l).lower(),
                        name_l, "lowercase"))  # fmt: skip
        elif name.upper() != name:  # the others: capitals
            out.append((en.replace("{N}", name).upper(), fr.replace("{N}", name).upper(),
                        name.upper(), "capitals"))  # fmt: skip
    return out


def copied(name: str, variant: str, hypothesis: str) -> bool:
    """Whether `hypothesis` carries `name` over exactly (see the module's docstring)."""
    forms = [name] + ([name.capitalize()] if variant == "lowercase" else [])
    return any(_whole(form).search(hypothesis) for form in forms)


def read_table(path: Path) -> list[dict[str, str]]:
    """The set's rows (`write`'s columns), each checked to have them."""
    table = list(csv.DictReader(read_lines(path), delimiter="\t"))
    for i, row in enumerate(table, start=2):  # line 1 is the header
        if any(row.get(column) is None for column in COLUMNS):
            raise NmtError(f"{path}: line {i}: expected the columns {', '.join(COLUMNS)}")
    return table


def _tsv(table: list[tuple[str, str, str, str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(table)
    return out.getvalue().encode("utf-8")


def names_copied(translator: Any, names: Path, *, beam: int) -> float:
    """The share of `names`' sentences whose name `translator` carries over exactly."""
    table = read_table(names)
    out = translator.translate([row["en"] for row in table], beam=beam)
    hits = [copied(r["name"], r["variant"], t.text) for r, t in zip(table, out, strict=True)]
    return sum(hits) / len(hits)


def report(table: list[dict[str, str]], hyps: list[str]) -> None:
    """The share copied, overall and per variant, and the first misses."""
    by_variant: dict[str, list[bool]] = {}
    misses = []
    for row, hyp in zip(table, hyps, strict=True):
        ok = copied(row["name"], row["variant"], hyp)
        by_variant.setdefault(row["variant"], []).append(ok)
        if not ok:
            misses.append(f"  {row['name']}: {row['en']} -> {hyp}")
    every = [ok for oks in by_variant.values() for ok in oks]
    print(
        f"names copied exactly: {sum(every)}/{len(every)} = {100 * sum(every) / len(every):.1f} %"
    )
    for variant, oks in by_variant.items():
        print(f"  {variant}: {sum(oks)}/{len(oks)} = {100 * sum(oks) / len(oks):.1f} %")
    print("misses:\n" + "\n".join(misses[:40]) if misses else "misses: none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--data", type=Path, default=Path("../shared/data"))
    w.add_argument("--untuned", action="store_true", help="the second set, UNTUNED_NAMES")
    w.add_argument("--out", type=Path, help="docs/names.tsv (docs/names_untuned.tsv)")
    s = sub.add_parser("score")
    s.add_argument("names", type=Path)
    s.add_argument("hyps", type=Path, help="one translation per line of the set's English")
    m = sub.add_parser("model")
    m.add_argument("model", nargs="+", help="run directory or checkpoint (several: an ensemble)")
    m.add_argument("--names", type=Path, default=Path("docs/names.tsv"))
    m.add_argument("--beam", type=whole(1), default=5)
    m.add_argument("--hyps", type=Path, help="also write the translations here")
    args = parser.parse_args()
    with one_line():
        _command(args)


def _command(args: argparse.Namespace) -> None:
    if args.command == "write":
        names = UNTUNED_NAMES if args.untuned else NAMES
        out = args.out or Path("docs/names_untuned.tsv" if args.untuned else "docs/names.tsv")
        check_output(out, "--out")  # before reading the corpora
        seen = _seen_names(args.data, names)
        table = rows(names, seen)
        write_output(out, _tsv(table))
        dropped = ", ".join(sorted(seen)) or "none"
        print(f"{out}: {len(table)} sentences, {len(names) - len(seen)} names "
              f"({len(seen)} dropped, seen in training: {dropped})")  # fmt: skip
        return
    if args.command == "score":
        table = read_table(args.names)
        hyps = read_lines(args.hyps)
        if len(hyps) != len(table):
            raise NmtError(f"{args.hyps}: {len(hyps)} lines for {len(table)} sentences")
        report(table, hyps)
        return
    from nmt.translate import Translator

    table = read_table(args.names)
    if args.hyps:  # before the model loads
        check_output(args.hyps, "--hyps", [(args.names, "--names")])
    translator = Translator.from_checkpoint(args.model if len(args.model) > 1 else args.model[0])
    hyps = [t.text for t in translator.translate([r["en"] for r in table], beam=args.beam)]
    if args.hyps:
        write_lines(args.hyps, hyps)
    report(table, hyps)


if __name__ == "__main__":
    main()
