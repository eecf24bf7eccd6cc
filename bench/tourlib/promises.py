"""The checks of the tour's steps whose promises are about the world, not only about
what a command printed: each reads Nova, fleet state, Slurm, the Kubernetes stand-in
or the replicas' /metrics, and says what it saw instead when a promise does not hold
(None when every one does). A `before_*` function records what a step's check
compares with, before the step's commands run."""

from __future__ import annotations

import json
import re
import statistics
import time
from typing import Any

import yaml

from sco.adapters.slurm.nodes import node_name
from sco.domain.times import utc
from tourlib.lab import Lab, meta

POOL = "lab/hall-a/spot.small"  # the pool step 11 takes back
_NOTICE = "reclaim_notice"
RECLAIMED = re.compile(r"^(\S+) \((\S+)\): (.+)$", re.M)  # `sco reclaim`: a server it noticed


def table(out: str, key: int) -> dict[str, list[str]]:
    """A rich table's rows by their `key` column, each cell's wrapped lines joined."""
    rows: dict[str, list[str]] = {}
    last: list[str] | None = None
    for line in out.splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[key]:
            last = rows[cells[key]] = cells
        elif last is not None:
            last[:] = [f"{a} {b}".strip() for a, b in zip(last, cells, strict=False)]
    return rows


def _terms(text: str) -> dict[str, str]:
    return dict(t.rsplit(" ", 1) for t in text.split(", ") if " " in t)


def _shown(terms: dict[str, float]) -> dict[str, str]:
    """Terms as `sco explain` prints them (those not zero)."""
    return {k: f"{v:.3g}" for k, v in terms.items() if v}


# ---------------------------------------------------------------- 5. Read the plan


def planned(lab: Lab, out: str) -> str | None:
    flat = " ".join(out.split())
    m = re.search(r"batch: plan generation (\d+)", flat)
    plan = {p["generation"]: p for p in lab.plans("batch")}.get(int(m[1])) if m else None
    if plan is None:
        return "explain shows no plan of batch's that fleet state holds"
    notes = [n for n in plan["notes"] if f"why: {n}" not in flat]
    said = re.search(r"partition: (.*?) pools \(terms", flat)
    if notes or not said or _terms(said[1]) != {k: f"{v:.3g}" for k, v in plan["terms"].items()}:
        return f"the plan's notes {notes} or figures are not as fleet state has them"
    region = yaml.safe_load((lab.folder / "region.yaml").read_text())
    prices = {f"{region['region']}/{p['hall']}/{p['flavor']}": p for p in region["pools"]}
    rows = table(out, key=0)
    for pool, why in plan["pools"].items():
        row = rows.get(pool, [""] * 9)
        wanted = [str(why["target"]), f"{prices[pool]['price_per_h']:.3f}", _shown(why["terms"])]
        if [row[2], row[5], _terms(row[7])] != wanted:
            return f"{pool}: target, price, terms {row[2:8]}; fleet state and region: {wanted}"
    return _last_hour(lab, flat)


def _last_hour(lab: Lab, flat: str) -> str | None:
    said = re.search(
        r"(\d+) creates \(\d+ replacing reclaimed\); (\d+) ready "
        r"\(request to ready p50 (\d+) s, max (\d+) s\)",
        flat,
    )
    moved = lab.history("batch", time.time() - 3600)
    asked = {r.server: r.at for r in moved if r.created}
    took = [r.at - asked[r.server] for r in moved if r.trigger == "node_joined"]
    if not took:
        return "no batch node ready yet"
    recorded = (len(asked), len(took), f"{statistics.median(took):.0f}", f"{max(took):.0f}")
    shown = (int(said[1]), int(said[2]), said[3], said[4]) if said else None
    if shown != recorded or recorded[:2] != (4, 4):
        return f"last hour (creates, ready, p50, max): shown {shown}, recorded {recorded}"
    return None


# ---------------------------------------------------------------- 7. Take a server back


def noticed(lab: Lab, out: str) -> str | None:
    picked = RECLAIMED.findall(out)
    if len(picked) != 1 or picked[0][1] != "batch" or "noticed 1 of 1" not in out:
        return f"not one batch server noticed: {out[-300:]}"
    server = picked[0][0]
    there = {s["id"]: s for s in lab.servers("batch")}.get(server)
    if there is None or there["status"] != "ACTIVE":
        return f"{server} is not an ACTIVE batch server (the command was not to wait)"
    at = meta(there).get("sco:reclaim-at", "")
    left = float(at) - time.time() if at.isdigit() else 0.0
    if meta(there).get("sco:class") != "spot" or not 20 < left <= 31:
        return f"{server}: sco:reclaim-at {at!r} is {left:.0f} s away, not 30, or not spot"
    lab.seen.update(server=server, node=node_name(server), deadline=float(at))
    return None


# ---------------------------------------------------------------- 8. See the drain


def draining(lab: Lab, out: str) -> str | None:
    node, server, deadline = lab.seen["node"], lab.seen["server"], lab.seen["deadline"]
    seen = [r.at for r in lab.history("batch") if r.server == server and r.code == _NOTICE]
    held = lab.sql("SELECT notice_deadline FROM instances WHERE server_id = ?", server)
    if not seen or not held or held[0][0] != deadline:
        return "sco has not seen the notice, or holds another deadline than Nova's"
    slurm = lab.slurm_node(node)
    drained = re.search(rf"^{node}\s+1\s+batch\s+(drng|drain)", out, re.M)
    if not drained or "DRAIN" not in slurm["state"] or utc(deadline) not in slurm["reason"]:
        return f"{node} is not DRAIN with the deadline {utc(deadline)} in its reason: {slurm}"
    page = json.loads(lab.get(f"{lab.env['LAB_STATUS']}/status.json"))
    contract = next((c for c in page["contracts"] if c["server"] == server), {})
    if contract.get("state") != "leaving":
        return f"its contract does not say leaving: {contract}"
    read = rf"agent {node}: .*contract version {contract['version']}: leaving"
    if not re.search(read, lab.log()):
        return f"its agent has not read version {contract['version']}"
    coming = [r for r in lab.history("batch", min(seen)) if r.created]
    if not any(r.code == "replace_reclaimed" for r in coming):
        return "no replacement requested"
    return None


# ---------------------------------------------------------------- 10. What happened


def counted(lab: Lab, out: str) -> str | None:
    flat = " ".join(out.split())
    said = re.search(
        r"(\d+) reclaims with notice, \d+ without; \d+ creates \((\d+) replacing reclaimed\)"
        r".*?(\d+) drains: (\d+) left in time",
        flat,
    )
    moved = lab.history("batch", time.time() - 3600)
    in_time = [r for r in moved if r.trigger == "delete_sent" and r.code == "node_drained"]
    recorded = (
        sum(r.trigger == _NOTICE for r in moved),
        sum(r.created and r.code == "replace_reclaimed" for r in moved),
        sum(r.trigger == "drain_requested" for r in moved),
        len(in_time),
    )
    shown = tuple(int(n) for n in said.groups()) if said else None
    if shown != recorded or recorded[:2] != (1, 1):
        return f"explain (reclaims, replacing, drains, in time) {shown}, recorded {recorded}"
    server, deadline = lab.seen["server"], lab.seen["deadline"]
    if not any(r.server == server and r.at < deadline for r in in_time):
        return f"{server} has not left in time"
    if time.time() > deadline + 5 and server in _ids(lab, "batch"):
        return f"{server} is still there after its deadline"
    return _replicas(lab, lab.seen["step_out"]) or _in_red(lab)


def _ids(lab: Lab, partition: str) -> set[str]:
    return {s["id"] for s in lab.servers(partition)}


def _replicas(lab: Lab, out: str) -> str | None:
    """Each replica counts what the partitions it leads saw; the two share them."""
    if not re.search(r'^sco_reclaims_total\{[^}]*partition="batch"[^}]*\} 1', out, re.M):
        return "the command does not show the reclaim counted"
    leads: dict[str, set[str]] = {}
    for name in ("RUN_A", "RUN_B"):
        samples = lab.metrics(lab.env[f"LAB_{name}"])
        leads[name] = {
            s.labels["partition"]
            for s in samples
            if s.name == "sco_partition_leader" and s.value == 1
        }
        want = 1.0 if "batch" in leads[name] else 0.0
        for metric, kind in (("sco_reclaims_total", "notice"), ("sco_replacements_total", None)):
            n = sum(
                s.value
                for s in samples
                if s.name == metric
                and s.labels.get("partition") == "batch"
                and kind in (None, s.labels.get("kind"))
            )
            if n != want:
                return f"{name} counts {n:.0f} in {metric} of batch, leading {leads[name]}"
    shared = sorted(p for led in leads.values() for p in led)
    if shared != ["batch", "metal", "web"] or not all(leads.values()):
        return f"the replicas do not share the partitions: {leads}"
    return None


def _in_red(lab: Lab) -> str | None:
    page = lab.get(f"{lab.env['LAB_STATUS']}/")
    if not re.search(
        r'class="l bad" data-field="last_hour">[^<]*[1-9]\d* reclaims? with notice', page
    ):
        return "the status page does not show the last hour's reclaim in red"
    return None


# ---------------------------------------------------------------- 11. Exclude a pool


def before_burst(lab: Lab) -> None:
    lab.seen["burst_at"] = time.time()
    lab.seen["in_pool"] = {
        s["id"]: meta(s)["sco:partition"]
        for s in lab.servers()
        if meta(s).get("sco:pool") == POOL
        and "sco:reclaim-at" not in meta(s)
        and s.get("OS-EXT-STS:task_state") != "deleting"
    }


def excluded(lab: Lab, out: str) -> str | None:
    why = _burst(lab, lab.seen["step_out"])
    if why:
        return why
    ex = lab.sql("SELECT since, until, reason FROM exclusions WHERE pool = ? AND state = ?",
                 POOL, "excluded")  # fmt: skip
    if not ex or ex[0]["since"] < lab.seen["burst_at"]:
        return f"{POOL} is not excluded in fleet state"
    since, until, rule = ex[0]
    why = _rule(lab, since, rule)
    if why:
        return why
    status = table(out, key=1).get(POOL, [""] * 9)[8]
    if status != f"excluded until {utc(until)}" or f"last excluded: {rule}" not in out:
        return f"sco pools shows {POOL} as {status!r}, not with {rule!r} until {utc(until)}"
    return _kept_out(lab, since) or _whole_again(lab)


def _burst(lab: Lab, out: str) -> str | None:
    """`sco reclaim` gave notice to every server the pool had (up to four) but those sco
    was deleting already, said why for each and how many it is short; sco saw each."""
    before, since = lab.seen["in_pool"], lab.seen["burst_at"]
    picked = {sid: part for sid, part, why in RECLAIMED.findall(out) if why.strip()}
    m = re.search(r"noticed (\d+) of 4, .*; short (\d+)", out)
    if not m or (int(m[1]), int(m[2])) != (len(picked), 4 - len(picked)):
        return f"noticed {picked}, and said {m[0] if m else out[-200:]}"
    seen: list[float] = []
    for sid, part in picked.items():
        mine = [r.at for r in lab.history(part, since) if r.server == sid and r.code == _NOTICE]
        if before.get(sid) != part or not mine:
            return f"{sid} ({part}) was not in the pool, or sco has not seen its notice"
        seen += mine
    left = [
        sid
        for sid, part in before.items()
        if sid not in picked
        and not any(
            r.server == sid and r.trigger == "delete_sent" and r.at <= max(seen)
            for r in lab.history(part, since - 60)
        )
    ]
    if left and len(picked) < 4:
        return f"{left} of the pool not noticed, nor being deleted; noticed {picked}"
    return None


def _rule(lab: Lab, since: float, rule: str) -> str | None:
    """The rule's reclaims are in the event log, and `sco watch` has read them."""
    m = re.match(r"(\d+) reclaims in (\d+)s", rule)
    if not m:
        return f"the rule {rule!r} is not a count of reclaims"
    logged = lab.sql('SELECT "offset", payload FROM event_log WHERE pool = ?', POOL)
    window = sorted(
        o
        for o, payload in logged
        if (e := json.loads(payload))["kind"] == _NOTICE and since - int(m[2]) <= e["at"] <= since
    )
    read = lab.sql("SELECT \"offset\" FROM consumer_offsets WHERE consumer = 'exclusion-watcher'")
    if len(window) < int(m[1]) or not read or read[0][0] < window[-1]:
        return f"the event log holds {len(window)} reclaims of {POOL}; sco watch read to {read}"
    return None


def _kept_out(lab: Lab, since: float) -> str | None:
    """From each partition's first plan that reads the exclusion (within seconds), no
    plan asks the pool for more than it holds there, and what is created goes to hall-b."""
    for partition in ("batch", "web"):
        plans = [p for p in lab.plans(partition) if p["created_at"] >= since]
        reading = [p for p in plans if "excluded" in p["pools"].get(POOL, {}).get("flags", [])]
        if not reading or reading[0]["created_at"] > since + 15:
            return f"no plan of {partition} has read the exclusion within 15 s"
        first = reading[0]
        later = [p["pools"][POOL] for p in plans if p["generation"] >= first["generation"]
                 and POOL in p["pools"]]  # fmt: skip
        if any(w["target"] > w["held"] or "excluded" not in w["flags"] for w in later):
            return f"a plan of {partition} asks {POOL} for more: {later}"
        made = [r.pool for r in lab.history(partition, first["created_at"]) if r.created]
        there = [
            s["id"]
            for s in lab.servers(partition)
            if meta(s).get("sco:pool") == POOL
            and int(meta(s).get("sco:generation", "0")) >= first["generation"]
        ]
        if there or any(not pool.startswith("lab/hall-b/") for pool in made):
            return f"{partition} created in {made} and Nova has {there} of plans since"
    return None


def _whole_again(lab: Lab) -> str | None:
    """`batch` replaced what it lost: four ready nodes again, no server under notice."""
    lost = sum(part == "batch" for part in lab.seen["in_pool"].values())
    moved = lab.history("batch", lab.seen["burst_at"])
    replaced = sum(r.created and r.code == "replace_reclaimed" for r in moved)
    up = [s for s in lab.servers("batch") if "sco:reclaim-at" not in meta(s)]
    ready = lab.sql("SELECT count(*) FROM instances WHERE partition = 'batch' AND state = 'ready'")
    if replaced < lost or len(up) != 4 or ready[0][0] != 4:
        return f"batch: {replaced} of {lost} replaced, {len(up)} servers, {ready[0][0]} ready"
    return None


# ---------------------------------------------------------------- 12. Hand a partition back


def before_handback(lab: Lab) -> None:
    """web's servers, Nodes and their pods, but those a reclaim is taking already."""
    servers = {
        s["id"]
        for s in lab.servers("web")
        if "sco:reclaim-at" not in meta(s) and s.get("OS-EXT-STS:task_state") != "deleting"
    }
    nodes = {
        n["metadata"]["name"]
        for n in lab.kube("nodes")
        if n["spec"].get("providerID", "").rsplit("/", 1)[-1] in servers
    }
    pods = {_pod(p) for p in lab.kube("pods") if p["spec"].get("nodeName") in nodes}
    lab.seen["web"] = {"at": time.time(), "servers": servers, "nodes": nodes, "pods": pods}


def _pod(p: dict[str, Any]) -> str:
    return f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"


def handed_back(lab: Lab, out: str) -> str | None:
    was = lab.seen["web"]
    if "holds nothing" not in out or _ids(lab, "web"):
        return f"web still holds servers: {_ids(lab, 'web')}"
    moved = lab.history("web")
    due = dict(lab.sql("SELECT server_id, drain_by FROM instances WHERE partition = 'web'"))
    hard = []  # from when sco would delete, not evict, what is left on each node
    for sid in was["servers"]:
        mine = [r for r in moved if r.server == sid]
        drains = [r.at for r in mine if r.trigger == "drain_requested"]
        left = [r.at for r in mine if r.trigger == "delete_sent" and r.code == "node_drained"]
        if not drains or not left or left[-1] < drains[-1] or not due.get(sid):
            return f"{sid} was not drained before it was deleted: {[r.trigger for r in mine]}"
        hard.append(drains[-1] + (due[sid] - drains[-1]) / 2)
    why = _evicted(lab, was, min(hard, default=0.0))
    if why:
        return why
    intent = lab.sql("SELECT intent FROM partition_intents WHERE partition = 'web'")
    if not intent or intent[0][0] != "handback":
        return "fleet state holds no handback of web"
    return _nothing_more(lab, was["at"])


def _evicted(lab: Lab, was: dict[str, Any], hard_at: float) -> str | None:
    """The pods left web's nodes before sco would delete them (from half a drain's time
    on): they were evicted. Its Nodes were cordoned, or are gone with their servers."""
    there = [p for p in map(_pod, lab.kube("pods")) if p in was["pods"]]
    nodes = [n for n in lab.kube("nodes") if n["metadata"]["name"] in was["nodes"]]
    if there or any(not n["spec"].get("unschedulable") for n in nodes):
        return f"pods {there} still there, or a node of web's not cordoned"
    if was["pods"] and time.time() >= hard_at:
        return "too late to tell the pods' eviction from their deletion at the hard time"
    return None


def _nothing_more(lab: Lab, since: float) -> str | None:
    """Holding nothing, web's leader holds to the handback through a cycle more and
    creates nothing."""
    empty_at, leader = time.time(), _leader(lab, "web")
    while leader.get("sco_partition_last_cycle_timestamp_seconds", 0) < empty_at:
        if time.time() > empty_at + 20:
            return f"web's leader has not cycled since it held nothing: {leader}"
        time.sleep(1)
        leader = _leader(lab, "web")
    if leader.get("sco_partition_handback") != 1:
        return f"web's leader does not hold to the handback: {leader}"
    made = [r.pool for r in lab.history("web", since) if r.created]
    return f"web created in {made} after the handback" if made or _ids(lab, "web") else None


def _leader(lab: Lab, partition: str) -> dict[str, float]:
    """The partition's samples at the replica that leads it (none while no one does)."""
    for name in ("RUN_A", "RUN_B"):
        mine = {
            s.name: s.value
            for s in lab.metrics(lab.env[f"LAB_{name}"])
            if s.labels.get("partition") == partition
        }
        if mine.get("sco_partition_leader") == 1:
            return mine
    return {}
