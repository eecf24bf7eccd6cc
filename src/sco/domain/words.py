"""Answers to a name that is not known: the known one it most likely meant."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name nearest `word` (a typo, another case, '-' for '_'), if any is
    near enough to be what was meant."""
    names = list(known)
    folded = {n.lower().replace("-", "_"): n for n in names}
    exact = folded.get(word.lower().replace("-", "_"))
    if exact is not None:
        return exact
    found = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown(what: str, word: str, known: Iterable[str]) -> str:
    """`unknown policy 'sko'; did you mean 'sco'? (known: a, b, c)`."""
    names = sorted(known)
    guess = closest(word, names)
    hint = f"; did you mean {guess!r}?" if guess is not None else ""
    return f"unknown {what} {word!r}{hint} (known: {', '.join(names)})"
