"""nmt: a neural machine translation toolkit (bidirectional-RNN encoder, attention decoder).

`from nmt import Translator` loads the translation API on first use, so `import nmt` (and
`nmt --help`) stay light: torch is imported only by what needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nmt.translate import Translation, Translator

__all__ = ["Translation", "Translator"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nmt import translate

        return getattr(translate, name)
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
