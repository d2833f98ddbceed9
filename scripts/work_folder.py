"""A script's --work folder: new, empty, or the script's own, never a folder of the user's.

Why: the scripts that train (`compare_peers.py`, `attention_study.py`) delete and remake their
own folders inside --work (a peer's run, a cell cut short, the shared pieces). In a folder of
the user's that happened to hold a folder of the same name, the user's would be lost. So a
script marks the folders it fills, and fills only those, new ones, and empty ones; anything
else is refused in one line before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NmtError
from nmt.files import FileError, atomic_write


@dataclass(frozen=True)
class WorkFolder:
    """One script's kind of work folder. `earlier`: paths (files or folders) that only a
    version of the script from before the mark leaves there, which count as its mark."""

    script: str  # e.g. scripts/compare_peers.py
    mark: str  # the mark's file name inside the folder
    remakes: str  # what the script deletes and remakes there, for the refusal's words
    earlier: tuple[str, ...] = ()

    def ours(self, work: Path) -> bool:
        """Whether `work` is a folder of this script's (its mark, or an earlier run's)."""
        return (work / self.mark).is_file() or any((work / p).exists() for p in self.earlier)

    def claim(self, work: Path, flag: str = "--work") -> None:
        """Make `work` (made if missing) this script's folder and mark it; raises NmtError
        (one line naming `flag`) where it is not a folder, is a folder of the user's with
        anything in it, or cannot be made or marked."""
        if work.exists() and not work.is_dir():
            raise NmtError(f"{flag} {work}: not a folder; expected one the script may fill")
        if work.is_dir() and not self.ours(work) and any(work.iterdir()):
            raise NmtError(
                f"{flag} {work}: a folder this script did not make, and not empty (the script "
                f"deletes and remakes its own folders there: {self.remakes}); "
                "choose a new or an empty folder"
            )
        try:
            work.mkdir(parents=True, exist_ok=True)
            if not (work / self.mark).is_file():
                atomic_write(work / self.mark, f"a work folder of {self.script}\n".encode())
        except OSError as e:
            raise NmtError(f"{flag} {work}: cannot make it a folder ({e.strerror})") from None
        except FileError as e:
            raise NmtError(f"{flag} {e}") from None
