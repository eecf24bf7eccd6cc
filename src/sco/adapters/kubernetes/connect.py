"""A client for a Kubernetes API server, checked at start: a kubeconfig (or the
pod's service account) that loads, and an API server that answers a list of nodes
and of pods; and the client's own refusal, for a simulated API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ConnectError(Exception):
    """The cluster cannot be used; `field` is the setting to look at."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(why)
        self.field = field
        self.why = why


def client_installed() -> bool:
    """Whether the `kubernetes` extra is installed."""
    try:
        import kubernetes.client.exceptions  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def api_error(status: int, reason: str) -> Exception:
    """The error the client raises for an API server's refusal: for a simulated API
    server, so that the adapters' handling runs as against a real one."""
    from kubernetes.client.exceptions import ApiException

    error: Exception = ApiException(status=status, reason=reason)
    return error


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def connect(
    *, in_cluster: bool, kubeconfig: Path | None, context: str | None, timeout_s: float
) -> Any:
    """A `CoreV1Api`, once the API server has answered; ConnectError otherwise."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    what = "in_cluster" if in_cluster else "kubeconfig"
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=cfg)
        else:
            path = str(kubeconfig) if kubeconfig is not None else None
            config.load_kube_config(path, context, client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as e:
        raise ConnectError(what, _one_line(e)) from None
    except Exception as e:  # a kubeconfig that is not YAML
        raise ConnectError("kubeconfig", f"{type(e).__name__}: {_one_line(e)}") from None
    cfg.retries = 0  # a start check must not wait out urllib3's retries
    core = client.CoreV1Api(client.ApiClient(cfg))
    try:
        core.list_node(limit=1, _request_timeout=timeout_s, _preload_content=False)
        core.list_pod_for_all_namespaces(
            limit=1, _request_timeout=timeout_s, _preload_content=False
        )
    except ApiException as e:
        raise ConnectError(
            "", f"the API server at {cfg.host} refused: {e.status} {e.reason}"
        ) from None
    except Exception as e:  # unreachable: refused, timed out, name unknown, TLS
        raise ConnectError(
            "", f"cannot reach the API server at {cfg.host}: {type(e).__name__}"
        ) from None
    return core
