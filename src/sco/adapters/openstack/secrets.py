"""The cloud credential from clouds.yaml (openstacksdk's own places), the default;
OpenBao is the other source (`sco.adapters.openbao`), and the assembly picks one
(`sco.assembly.secrets`).
"""

from __future__ import annotations

from sco.ports import Credential


class CloudsYamlSecrets:
    """The credential stays where openstacksdk reads it (clouds.yaml, secure.yaml or
    OS_* variables); sco adds nothing and never sees it."""

    def credential(self) -> Credential:
        return Credential(source="clouds.yaml")
