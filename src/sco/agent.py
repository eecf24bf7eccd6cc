"""The node agent: follows its node's contract and leaves its scheduler before `drain_by`.

It long-polls the distributor with the contract's ETag. When the contract says the
node is leaving, it drains the node (a command, given the deadline) at once, or
`drain_lead_s` before the deadline so that the node serves while its replacement
boots, and acknowledges the version that asked: drained, or failed with why.

Static stability: the last contract is kept in a state file (written atomically),
so with the distributor unreachable, or across the agent's own restart, a node
that was told to leave still leaves by its deadline, and a drain that succeeded
is never run again for one contract. A drain that fails (an API server away for
a moment, a command that exits non-zero) is tried again, its pause doubling from
`drain_retry_s` up to `drain_retry_max_s` and never more than half the time left,
until it succeeds or too little time is left before `drain_by`; then it is
acknowledged as failed with the last reason. Requests back off exponentially
with full jitter. The token is read again when the distributor refuses it (it
may have been rotated); it is never logged.

It reads contracts through the domain's own types (`sco.domain.contracts`), the
one part of sco it imports: an agent runs on every node, so it stays small.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sco.domain.contracts import AckStatus, Contract, MalformedContract, NodeState
from sco.domain.times import utc

log = logging.getLogger(__name__)

META_NODE_TOKEN = "sco:node-token"  # as sco.adapters.openstack.resources sets it


class AgentError(Exception):
    """Bad configuration or a token that cannot be read: the agent cannot start."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    distributor: str  # https://host:port
    state_file: Path
    drain_command: str  # run with SCO_DRAIN_BY etc. in its environment ("" with a drainer)
    token_file: Path | None = None
    metadata_url: str | None = None  # OpenStack metadata (meta_data.json) holding the token
    wait_s: float = 30.0
    ca_file: Path | None = None
    backoff_max_s: float = 30.0
    exit_when_gone: bool = True
    drain_lead_s: float | None = None  # start draining this long before drain_by; None: at once
    drain_retry_s: float = 5.0  # pause after a first failed drain; doubles per failure
    drain_retry_max_s: float = 60.0  # the pause between drain attempts never exceeds this


@dataclass
class AgentState:
    """What survives a restart."""

    etag: str | None = None
    contract: Contract | None = None
    drained_version: int | None = None  # the leaving version whose drain ran
    result: tuple[str, str] | None = None  # (status, detail) of that drain
    acked_version: int | None = None
    drain_failures: int = 0  # failed attempts of the drain under way
    retry_at: float | None = None  # when the drain under way is tried again

    @classmethod
    def load(cls, path: Path) -> AgentState:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as e:
            log.warning("agent: state file %s unreadable (%s); starting afresh", path, e)
            return cls()
        result = doc.get("result")
        etag, contract = doc.get("etag"), None
        if doc.get("contract") is not None:
            try:
                contract = Contract.from_json(doc["contract"])
            except MalformedContract as e:
                # Asked again without an ETag, the distributor sends it whole.
                log.warning("agent: state file %s: contract unreadable (%s)", path, e)
                etag = None
        return cls(
            etag=etag,
            contract=contract,
            drained_version=doc.get("drained_version"),
            result=(str(result[0]), str(result[1])) if isinstance(result, list) else None,
            acked_version=doc.get("acked_version"),
            drain_failures=int(doc.get("drain_failures") or 0),
            retry_at=doc.get("retry_at"),
        )

    def save(self, path: Path) -> None:
        doc = {
            "etag": self.etag,
            # The distributor's own form: a state file reads the same across versions.
            "contract": self.contract.as_json() if self.contract else None,
            "drained_version": self.drained_version,
            "result": list(self.result) if self.result else None,
            "acked_version": self.acked_version,
            "drain_failures": self.drain_failures,
            "retry_at": self.retry_at,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".agent-state.")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


@dataclass
class Backoff:
    base_s: float = 0.5
    max_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_s(self) -> float:
        """Full jitter: uniform up to base·2^failures, capped."""
        self.failures += 1
        return self.rng.uniform(0, min(self.max_s, self.base_s * 2**self.failures))

    def reset(self) -> None:
        self.failures = 0


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        http: httpx.Client | None = None,
        clock: Callable[[], float] = time.time,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
        drainer: Callable[[Contract], tuple[str, str]] | None = None,
    ) -> None:
        """`drainer(contract) -> (status, detail)` drains the node (e.g. out of Slurm);
        without one, the configured drain command does."""
        self.config = config
        self.drainer = drainer
        self.http = http or httpx.Client(
            base_url=config.distributor.rstrip("/"),
            verify=ssl.create_default_context(cafile=str(config.ca_file))
            if config.ca_file
            else True,
            timeout=httpx.Timeout(config.wait_s + 15, connect=5.0),
        )
        self.clock = clock
        self._run = run
        self.state = AgentState.load(config.state_file)
        self.backoff = Backoff(max_s=config.backoff_max_s)
        self._token: str | None = None

    # ------------------------------------------------------------ token

    def token(self) -> str:
        if self._token is None:
            self._token = self._read_token()
        return self._token

    def _read_token(self) -> str:
        c = self.config
        if c.token_file is not None:
            try:
                token = c.token_file.read_text().strip()
            except OSError as e:
                raise AgentError(f"--token-file {c.token_file}: {e.strerror}") from None
        elif c.metadata_url is not None:
            try:
                meta = httpx.get(c.metadata_url, timeout=5.0).json()
                token = str(meta.get("meta", {}).get(META_NODE_TOKEN, ""))
            except (httpx.HTTPError, ValueError, AttributeError) as e:
                raise AgentError(f"--metadata-url: {type(e).__name__}") from None
        else:
            raise AgentError("give --token-file or --metadata-url")
        if not token:
            raise AgentError("no node token yet (sco hands it to the server once it is up)")
        return token

    # ------------------------------------------------------------ loop

    def run_until(self, stop: threading.Event) -> int:
        """Poll, drain, acknowledge until stopped, or until the contract says the
        instance is over (exit 0)."""
        while not stop.is_set():
            pause = self.step()
            if self.gone():
                log.info("agent: the instance is over; exiting")
                return 0
            if pause:
                stop.wait(pause)
        return 0

    def gone(self) -> bool:
        c = self.state.contract
        return self.config.exit_when_gone and c is not None and c.terms.state is NodeState.GONE

    def step(self) -> float:
        """One poll, then what the contract asks; returns how long to pause (0: go on)."""
        pause = self._poll()
        self._act()
        if self._ack_owed():
            pause = max(pause, self._ack())
        due = self._drain_due()
        if due is not None:  # a backoff must not carry it past the drain's start
            pause = min(pause, max(0.0, due - self.clock()))
        return pause

    def _headers(self) -> dict[str, str]:
        h = {"Authorization": f"Bearer {self.token()}"}
        if self.state.etag:
            h["If-None-Match"] = self.state.etag
        return h

    def _drain_due(self) -> float | None:
        """When the drain the contract asks for starts, if one is still to run."""
        c = self.state.contract
        if c is None or c.terms.state is not NodeState.LEAVING or c.drain_by is None:
            return None
        if self.state.drained_version == c.version:
            return None
        lead = self.config.drain_lead_s
        start = self.clock() if lead is None else c.drain_by - lead
        retry = self.state.retry_at
        return start if retry is None else max(start, retry)

    def _poll(self) -> float:
        try:
            wait = self.config.wait_s if self.state.etag else 0
            due = self._drain_due()
            if due is not None:  # wake in time to start it
                wait = min(wait, max(0.0, due - self.clock()))
            r = self.http.get("/v1/contract", params={"wait": wait}, headers=self._headers())
        except AgentError as e:
            log.warning("agent: %s", e)
            return self.backoff.next_s()
        except httpx.HTTPError as e:
            log.warning(
                "agent: distributor unreachable (%s); keeping the last contract", type(e).__name__
            )
            return self.backoff.next_s()
        if r.status_code == 304:
            self.backoff.reset()
            return 0.0
        if r.status_code == 200:
            try:
                c = Contract.from_json(r.json())
            except ValueError as e:  # not JSON, or not a contract: keep the last one
                log.warning("agent: the distributor's contract is unreadable: %s", e)
                return self.backoff.next_s()
            self.backoff.reset()
            self.state.contract = c
            self.state.etag = r.headers.get("ETag")
            if c.terms.state is not NodeState.LEAVING:
                # Asked to stay after all: a later notice's drain starts afresh.
                self.state.drain_failures, self.state.retry_at = 0, None
            self.state.save(self.config.state_file)
            by = c.drain_by
            log.info(
                "agent: contract version %s: %s%s",
                c.version,
                c.terms.state,
                "" if by is None else f", drain by {utc(by)}",
            )
            return 0.0
        if _token_refused(r):
            self._token = None  # rotated, or not yet valid: read it again
        log.warning("agent: distributor answered %d", r.status_code)
        retry = r.headers.get("Retry-After", "")
        pause = self.backoff.next_s()
        return max(pause, float(retry)) if retry.isdigit() else pause

    # ------------------------------------------------------------ drain

    def _act(self) -> None:
        due = self._drain_due()
        if due is None or self.clock() < due:
            return
        c = self.state.contract
        assert c is not None
        assert c.drain_by is not None
        version = c.version
        s = self.state
        if (
            s.drained_version is not None
            and s.result is not None
            and s.result[0] != AckStatus.FAILED
        ):
            # Already drained for an earlier leaving version (its deadline moved):
            # the node is out; say so for this one.
            s.drained_version = version
            s.save(self.config.state_file)
            return
        status, detail = self._drain(c, c.drain_by)
        if status == AckStatus.FAILED:
            s.drain_failures += 1
            pause = self._retry_pause(c.drain_by)
            if pause is not None:
                s.retry_at = self.clock() + pause
                s.save(self.config.state_file)
                log.warning(
                    "agent: drain failed (%s); attempt %d in %.0f s",
                    detail, s.drain_failures + 1, pause,
                )  # fmt: skip
                return
            detail = f"{detail} (gave up after {s.drain_failures} attempts)"[:2000]
        s.result = (status, detail)
        s.drained_version = version
        s.drain_failures, s.retry_at = 0, None
        s.save(self.config.state_file)

    def _retry_pause(self, drain_by: float) -> float | None:
        """How long to wait before the next drain attempt, or None to give up: the
        pause doubles per failure up to its bound and takes at most half the time
        left, so tries get closer together near the deadline. With less than the
        first pause to spare an attempt would hardly finish, and sco is better told
        now that the node did not drain."""
        c = self.config
        backoff = min(c.drain_retry_max_s, c.drain_retry_s * 2 ** (self.state.drain_failures - 1))
        pause = min(backoff, (drain_by - self.clock()) / 2)
        return pause if pause >= c.drain_retry_s else None

    def _drain(self, c: Contract, drain_by: float) -> tuple[str, str]:
        if self.drainer is not None:
            log.info("agent: leaving by %s", utc(drain_by))
            return self.drainer(c)
        left = min(max(1.0, drain_by - self.clock()), 86_400.0)
        env = dict(
            os.environ,
            SCO_DRAIN_BY=str(int(drain_by)),
            SCO_DRAIN_BY_ISO=utc(drain_by),
            SCO_INSTANCE_ID=c.instance_id,
            SCO_PARTITION=c.terms.partition,
            SCO_CONTRACT_VERSION=str(c.version),
        )
        log.info("agent: leaving by %s: %s", env["SCO_DRAIN_BY_ISO"], self.config.drain_command)
        try:
            done = self._run(
                shlex.split(self.config.drain_command),
                env=env,
                capture_output=True,
                text=True,
                timeout=left,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return "failed", f"drain command still running at drain_by ({left:.0f} s)"
        except OSError as e:
            return "failed", f"drain command: {e.strerror}"
        out = (done.stdout or "").strip().splitlines()
        err = (done.stderr or "").strip().splitlines()
        if done.returncode == 0:
            return "drained", (out[-1] if out else "drained")[:2000]
        return "failed", f"exit {done.returncode}: {(err or out or [''])[-1]}"[:2000]

    # ------------------------------------------------------------ acknowledge

    def _ack_owed(self) -> bool:
        s = self.state
        return (
            s.drained_version is not None
            and s.result is not None
            and s.acked_version != s.drained_version
        )

    def _ack(self) -> float:
        s = self.state
        assert s.result is not None
        assert s.drained_version is not None
        status, detail = s.result
        try:
            r = self.http.post(
                "/v1/contract/ack",
                json={"version": s.drained_version, "status": status, "detail": detail},
                headers={"Authorization": f"Bearer {self.token()}"},
            )
        except (httpx.HTTPError, AgentError) as e:
            log.warning("agent: acknowledgement not delivered (%s); again later", type(e).__name__)
            return self.backoff.next_s()
        if r.status_code in (200, 409):
            s.acked_version = s.drained_version
            s.save(self.config.state_file)
            if r.status_code == 200:
                log.info("agent: acknowledged version %d: %s", s.drained_version, status)
            else:  # the next poll brings the new version
                log.info(
                    "agent: version %d %s, not recorded: the contract has moved on since "
                    "(sco saw the node leave by itself, or changed what it asks)",
                    s.drained_version, status,
                )  # fmt: skip
            return 0.0
        if _token_refused(r):
            self._token = None
        log.warning("agent: acknowledgement answered %d", r.status_code)
        return self.backoff.next_s()


def _token_refused(r: httpx.Response) -> bool:
    """The token was not accepted: a 401, or a 429 that says so (the distributor's
    answer to a bad token from an address that has failed too often, e.g. a NAT
    whose other nodes hold rotated tokens too)."""
    return r.status_code == 401 or "invalid_token" in r.headers.get("WWW-Authenticate", "")
