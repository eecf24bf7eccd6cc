"""A real Slurm cluster on this host for tests and benchmarks: munge, slurmctld, and
dynamic slurmd nodes, each in a network namespace of its own.

Several slurmd on one host would all bind SlurmdPort, and dynamic nodes may not
name a port of their own, so each node gets a network namespace (`ip netns`)
with a veth on a bridge of the cluster's; slurmctld listens on the bridge's
address. `scripts/slurm/install.sh` installs the Debian packages.

`SlurmBoot` plays the servers' boot for the Nova test stack: a server that is
ACTIVE with sco's metadata starts its slurmd (`slurmd -Z`, named and featured as
`sco.adapters.slurm.nodes` says a cloud-init template would), and a server that
is gone takes its slurmd with it.

Every daemon runs in a session of its own and the cluster is registered with
`sco_harness.services`: an interrupted test or bench stops it, network
namespaces and bridge included.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sco.adapters.slurm.nodes import node_features, node_name, slurm_conf_lines
from sco_harness import services
from sco_harness.openstack_stack import free_port, steady_port

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "scripts" / "slurm" / "install.sh"


def install() -> None:
    done = subprocess.run(
        ["bash", str(INSTALL)], capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"{INSTALL} failed:\n{done.stderr[-3000:]}")


@dataclass
class _Node:
    name: str
    netns: str
    address: str
    proc: subprocess.Popen[bytes]


@dataclass
class SlurmCluster:
    """`start()` brings it up; `conf` is its slurm.conf (SLURM_CONF)."""

    folder: Path
    partitions: Sequence[str] = ("batch",)
    sco_partition: str = "hpc"  # the sco partition whose nodes the Slurm partitions take
    cpus: int = 2
    memory_mb: int = 1000
    extra_conf: Sequence[str] = ()
    accounting: bool = False  # slurmdbd on a MariaDB of its own, for sacct
    pools: Sequence[tuple[str, str]] = ()  # (class, pool id): features on the placeholders
    files: Mapping[str, str] = field(default_factory=dict)  # name -> text, by slurm.conf
    nodes: dict[str, _Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder = self.folder.resolve()
        self.id = f"{os.getpid() % 1000:03d}{random.randrange(100):02d}"
        self.net = f"10.{random.randrange(64, 250)}.{random.randrange(1, 250)}"
        self.bridge = f"scob{self.id}"
        self.ctld_port = steady_port()
        self.conf = self.folder / "slurm.conf"
        self._addresses = itertools.count(10)
        self._ctld: subprocess.Popen[bytes] | None = None
        self._services: list[subprocess.Popen[bytes]] = []  # mariadbd, slurmdbd
        self.dbd_port = 0
        self._munged = False
        self.munge = self.folder / "munge"
        self._lock = threading.Lock()
        self._registered: services.Started | None = None

    # ------------------------------------------------------------ up and down

    def start(self) -> SlurmCluster:
        self._registered = services.started(f"Slurm in {self.folder}", self.stop)
        install()
        for sub in ("state", "spool", "log", "run", "jobs"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._start_bridge()
            if self.accounting:
                self.dbd_port = free_port()
            self._write_conf()
            if self.accounting:
                self._start_accounting()
            self._start_ctld()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, check=False, timeout=60
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def _start_munge(self) -> None:
        # munged runs as `munge`, which cannot reach into pytest's private folders.
        m = self.munge = Path(tempfile.mkdtemp(prefix="sco-munge-"))
        os.chmod(m, 0o755)
        shutil.copyfile("/etc/munge/munge.key", m / "key")
        subprocess.run(["chown", "-R", "munge:munge", str(m)], check=True)
        os.chmod(m / "key", 0o600)
        self._run(
            "runuser", "-u", "munge", "--", "munged",
            f"--key-file={m / 'key'}", f"--socket={m / 'sock'}",
            f"--pid-file={m / 'pid'}", f"--log-file={m / 'log'}", f"--seed-file={m / 'seed'}",
        )  # fmt: skip
        self._munged = True

    def _start_bridge(self) -> None:
        self._run("ip", "link", "add", self.bridge, "type", "bridge")
        self._run("ip", "addr", "add", f"{self.net}.1/24", "dev", self.bridge)
        self._run("ip", "link", "set", self.bridge, "up")

    def _start_accounting(self) -> None:
        """MariaDB and slurmdbd, as a site's accounting runs (sacct reads it)."""
        run = Path(self.munge)  # short: the MariaDB socket path has a length limit
        data, sock, db_port = self.folder / "mysql", run / "mysqld.sock", free_port()
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            capture_output=True, check=True, timeout=120,
        )  # fmt: skip
        self._spawn(
            "mariadb",
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
             f"--socket={sock}", f"--port={db_port}", "--bind-address=127.0.0.1",
             f"--pid-file={run / 'mariadbd.pid'}", "--skip-log-bin",
             "--innodb-flush-log-at-trx-commit=0", "--innodb-buffer-pool-size=64M"],
        )  # fmt: skip
        sql = (
            "CREATE DATABASE IF NOT EXISTS slurm_acct; "
            "CREATE USER IF NOT EXISTS slurm@'127.0.0.1' IDENTIFIED BY 'slurm'; "
            "GRANT ALL ON slurm_acct.* TO slurm@'127.0.0.1';"
        )
        _retry(lambda: self._run("mariadb", f"--socket={sock}", "-uroot", "-e", sql), 60)
        conf = self.folder / "slurmdbd.conf"  # slurmdbd reads it next to slurm.conf
        conf.write_text(
            "\n".join([
                "AuthType=auth/munge", f"AuthInfo=socket={self.munge / 'sock'}",
                "DbdHost=localhost", f"DbdPort={self.dbd_port}", "SlurmUser=root",
                f"LogFile={self.folder / 'log' / 'slurmdbd.log'}",
                f"PidFile={self.folder / 'run' / 'slurmdbd.pid'}",
                "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
                f"StoragePort={db_port}", "StorageUser=slurm", "StoragePass=slurm",
                "StorageLoc=slurm_acct",
            ]) + "\n"
        )  # fmt: skip
        os.chmod(conf, 0o600)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        _retry(lambda: self._run("sacctmgr", "-i", "add", "cluster", "sco"), 60)

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._services.append(
            services.spawn(argv, log=self.folder / "log" / f"{name}.out", env=self.env)
        )

    def sacct(self, *args: str) -> str:
        return self._run("sacct", *args).stdout

    def _write_conf(self) -> None:
        f = self.folder
        accounting = (
            [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=localhost",
                f"AccountingStoragePort={self.dbd_port}",
                # For slurmdbd this names the munge socket clients use to reach it.
                f"AccountingStoragePass={self.munge / 'sock'}",
            ]
            if self.accounting
            else []
        )
        lines = [
            "ClusterName=sco",
            # slurmctld runs here only if the host name is its own; the address is the
            # bridge's, which the nodes' namespaces reach.
            f"SlurmctldHost={socket.gethostname()}({self.net}.1)",
            "MailProg=/bin/true",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmdPort=6818",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge / 'sock'}",
            "CredType=cred/munge",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}/%n",
            f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log'}/slurmd-%n.log",
            "SlurmUser=root",
            "SlurmdUser=root",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=2,bf_interval=2,sched_min_interval=500000",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdTimeout=20",
            "ReturnToService=2",
            "MaxNodeCount=64",
            "MinJobAge=600",
            "GresTypes=gpu",
            *accounting,
            *self.extra_conf,
            *slurm_conf_lines(
                self.sco_partition, self.partitions, self.cpus, self.memory_mb, self.pools
            ),
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        for name, text in self.files.items():  # job_submit.lua: read beside slurm.conf
            (self.folder / name).write_text(text)

    def _start_ctld(self) -> None:
        self._ctld = services.spawn(
            ["slurmctld", "-D", "-i"], log=self.folder / "log" / "slurmctld.out", env=self.env
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._run("sinfo", check=False).returncode == 0:
                return
            if self._ctld.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(
            "slurmctld did not start:\n"
            + (self.folder / "log" / "slurmctld.out").read_text(errors="replace")[-3000:]
        )

    def restart_ctld(self) -> None:
        """slurmctld stopped (SIGTERM) and started again on its saved state."""
        self.stop_ctld(signal.SIGTERM)
        self.start_ctld()

    def stop_ctld(self, sig: int = signal.SIGTERM) -> None:
        """slurmctld stopped with `sig` (SIGKILL: a crash); the nodes' slurmd go on."""
        if self._ctld is not None:
            self._ctld.send_signal(sig)
            self._ctld.wait(timeout=30)

    def start_ctld(self) -> None:
        """slurmctld started on its saved state, unless it runs; returns once it answers."""
        if self._ctld is None or self._ctld.poll() is not None:
            self._start_ctld()

    def ctld_exit(self) -> int | None:
        """slurmctld's exit status if it has died (not stopped by us), else None."""
        return None if self._ctld is None else self._ctld.poll()

    def stop(self) -> None:
        services.forget(self._registered)
        for name in list(self.nodes):
            self.remove_node(name)
        if self._ctld is not None:
            services.stop_group(self._ctld, signal.SIGTERM, 30)
        self._run("ip", "link", "del", self.bridge, check=False)
        for proc in reversed(self._services):  # slurmdbd, then its database
            services.stop_group(proc, signal.SIGTERM, 30)
        pid_file = self.munge / "pid"
        if self._munged and pid_file.exists():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            shutil.rmtree(self.munge, ignore_errors=True)

    # ------------------------------------------------------------ nodes

    def add_node(self, name: str, features: Iterable[str]) -> None:
        """A dynamic node: its own network namespace, its slurmd registering itself."""
        with self._lock:
            if name in self.nodes:
                return
            k = next(self._addresses)
        netns, address = f"sco{self.id}n{k}", f"{self.net}.{k}"
        veth = f"v{self.id}n{k}"
        self._run("ip", "netns", "add", netns)
        self._run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}i")
        self._run("ip", "link", "set", f"{veth}i", "netns", netns)
        self._run("ip", "link", "set", veth, "master", self.bridge)
        self._run("ip", "link", "set", veth, "up")
        self._run("ip", "netns", "exec", netns, "ip", "addr", "add", f"{address}/24", "dev",
                  f"{veth}i")  # fmt: skip
        self._run("ip", "netns", "exec", netns, "ip", "link", "set", f"{veth}i", "up")
        self._run("ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
        (self.folder / "spool" / name).mkdir(parents=True, exist_ok=True)
        conf = (
            f"CPUs={self.cpus} RealMemory={self.memory_mb} "
            f"Feature={','.join(features)} NodeAddr={address}"
        )
        log = (self.folder / "log" / f"slurmd-{name}.out").open("ab")
        proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/var/run/netns/{netns}",
                "slurmd",
                "-D",
                "-Z",
                "-N",
                name,
                "--conf",
                conf,
            ],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self._lock:
            self.nodes[name] = _Node(name, netns, address, proc)

    def remove_node(self, name: str) -> None:
        """The server is gone: its slurmd (and the jobs' processes in its namespace) too."""
        with self._lock:
            node = self.nodes.pop(name, None)
        if node is None:
            return
        with contextlib.suppress(OSError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)
        for pid in self._run("ip", "netns", "pids", node.netns, check=False).stdout.split():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        self._run("ip", "netns", "del", node.netns, check=False)

    # ------------------------------------------------------------ jobs

    def sbatch(self, *args: str, seconds: float = 5.0) -> int:
        """A batch job that sleeps, then writes its id to `jobs/done` (requeued jobs run
        again: the file keeps every completion)."""
        done = self.folder / "jobs" / "done"
        script = f"sleep {seconds}; echo $SLURM_JOB_ID >> {done}"
        where = [] if any(a.startswith(("-p", "--partition")) for a in args) else [
            "-p", self.partitions[0]
        ]  # fmt: skip
        out = self._run(
            "sbatch", "--parsable", "-o", str(self.folder / "jobs" / "%j.out"), *where, *args,
            "--wrap", script,
        )  # fmt: skip
        return int(out.stdout.strip().split(";")[0])

    def completed(self) -> set[int]:
        path = self.folder / "jobs" / "done"
        if not path.exists():
            return set()
        return {int(x) for x in path.read_text().split() if x.strip().isdigit()}

    def squeue(self) -> dict[int, str]:
        out = self._run("squeue", "-h", "-o", "%i %T", check=False).stdout
        return {int(i): s for i, s in (line.split() for line in out.splitlines() if line.strip())}

    def release_launch_failed(self) -> int:
        """Jobs a slurmctld crash left held ("launch failed requeued held") released."""
        out = self._run("squeue", "-h", "-t", "PD", "-o", "%i %r", check=False).stdout
        held = [x.split()[0] for x in out.splitlines() if "launch_failed" in x.replace(" ", "_")]
        if held:
            self._run("scontrol", "release", ",".join(held), check=False)
        return len(held)

    def node_states(self) -> dict[str, tuple[str, str]]:
        """name -> (state, features) as sinfo says."""
        out = self._run("sinfo", "-h", "-N", "-o", "%N %T %f", check=False).stdout
        rows = [line.split() for line in out.splitlines() if line.strip()]
        return {r[0]: (r[1], r[2] if len(r) > 2 else "") for r in rows}

    def describe(self, job_ids: Iterable[int]) -> str:
        """What scontrol says of the jobs and sinfo of the nodes, for a failure's message."""
        jobs = [self._run("scontrol", "show", "job", str(j), check=False).stdout for j in job_ids]
        nodes = self._run("sinfo", "-N", "-o", "%N %T %E", check=False).stdout
        return "\n".join([*jobs, nodes])

    def job_nodes(self, job_id: int) -> str:
        out = self._run("squeue", "-h", "-j", str(job_id), "-o", "%N", check=False).stdout
        return out.strip()


def _retry(fn: Callable[[], object], seconds: float) -> None:
    """`fn` until it stops raising RuntimeError, for a daemon that is starting."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fn()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class SlurmBoot:
    """Servers of the Nova test stack booting into Slurm nodes, as their cloud-init would.

    Every `every_s` it lists the stack's sco servers: one that is ACTIVE gets a slurmd
    (`refuse` names servers whose slurmd never starts: a boot that fails); one that is
    gone (or in ERROR) loses it.
    """

    def __init__(
        self,
        cluster: SlurmCluster,
        servers: Callable[[], list[dict[str, Any]]],
        every_s: float = 0.5,
    ) -> None:
        self.cluster = cluster
        self.servers = servers
        self.every_s = every_s
        self.refuse: set[str] = set()
        self.refuse_next = 0  # so many of the next servers never register
        self.booted: dict[str, str] = {}  # server id -> node name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        try:
            servers = self.servers()
        except Exception:
            return  # the stack is busy: next time
        active = {
            s["id"]: s
            for s in servers
            if s.get("status") == "ACTIVE" and (s.get("metadata") or {}).get("sco:partition")
        }
        for sid, s in active.items():
            if sid in self.booted or sid in self.refuse:
                continue
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.refuse.add(sid)
                continue
            meta = s["metadata"]
            name = node_name(sid)
            features = node_features(
                meta["sco:partition"],
                meta["sco:class"],
                meta["sco:pool"],
                meta.get("sco:installation", "default"),
            )
            self.cluster.add_node(name, features)
            self.booted[sid] = name
        for sid in list(self.booted):
            if sid not in active:
                self.cluster.remove_node(self.booted.pop(sid))

    def start(self) -> SlurmBoot:
        self._thread = threading.Thread(target=self._loop, name="slurm-boot", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.step()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
