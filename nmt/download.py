"""Corpora fetched from their public homes where a config asks for them (`download:
multi30k` or `tatoeba`) and they are not there: each file written atomically, and a failed
download one line naming the URL and where to put the file by hand (`DataError`)."""

from __future__ import annotations

import gzip
import io
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from nmt.errors import DataError
from nmt.files import FileError, atomic_write

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.gz"
TATOEBA_URL = "https://www.manythings.org/anki/{lang}-eng.zip"
TATOEBA_CODES = {"fr": "fra", "de": "deu", "es": "spa", "it": "ita", "pt": "por", "nl": "nld"}
USER_AGENT = "nmt (neural machine translation toolkit; corpus download)"


def download_multi30k(paths: Sequence[Path]) -> None:
    """Fetch Multi30k files (`{split}.{lang}`) from the dataset's public repository.

    Each file is written atomically, so an interrupted download never leaves a truncated
    corpus behind.
    """
    for path in paths:
        url = MULTI30K_URL.format(name=path.name)
        _fetch_into(url, path, gzip.decompress, f"put {path.name} (one sentence a line)")


def download_tatoeba(path: Path, lang: str, key: str = "data") -> None:
    """Fetch the manythings.org Anki export of Tatoeba pairs for English-`lang` (a zip
    holding `{code}.txt`: English<TAB>other<TAB>attribution) into `path`. The export grows
    over time: a fresh download is newer than the 2017 file the README's scores used."""
    code = TATOEBA_CODES.get(lang)
    if code is None:
        raise DataError(
            f"{key}.download: tatoeba knows English with {', '.join(TATOEBA_CODES)}, not "
            f"{lang!r}; put the pairs in {path} yourself"
        )

    def unzip(data: bytes) -> bytes:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return z.read(f"{code}.txt")

    url = TATOEBA_URL.format(lang=code)
    _fetch_into(url, path, unzip, f"put the English<TAB>{lang} pairs as {path.name}")


def _fetch_into(url: str, path: Path, unpack: Callable[[bytes], bytes], instead: str) -> None:
    try:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        with urllib.request.urlopen(request, timeout=60) as response:
            data = unpack(response.read())
    # URLError, timeouts and bad gzip data are OSErrors; a bad zip is BadZipFile or KeyError
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise DataError(
            f"could not download {url} ({reason}); {instead} in {path.parent} yourself"
        ) from None
    try:
        atomic_write(path, data)
    except FileError as e:
        raise DataError(f"downloaded {url}, but {e}") from None
