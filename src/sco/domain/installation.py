"""Installations: several sco may share a cloud project, each with its own servers.

Every server sco creates carries its installation's name; an installation lists,
adopts, deletes, notices and drains only its own. Servers tagged before
installations had names belong to the default one.
"""

from __future__ import annotations

DEFAULT_INSTALLATION = "default"


def is_mine(tagged: str | None, installation: str) -> bool:
    """Whether a server tagged for installation `tagged` (None: no installation tag) is
    `installation`'s."""
    return (tagged or DEFAULT_INSTALLATION) == installation
