"""OpenBao (or Vault): the cloud credential from its KV v2 engine, with a token or an
AppRole login, renewed and read again before its lease ends. `hvac` (in the
`openstack` extra) is imported only here, and only when it first connects."""

from __future__ import annotations

from sco.adapters.openbao.secrets import OpenBaoConfig, OpenBaoSecrets

__all__ = ["OpenBaoConfig", "OpenBaoSecrets"]
