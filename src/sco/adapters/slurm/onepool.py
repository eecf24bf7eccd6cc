"""Slurm keeps a job of many nodes in one pool: the job_submit.lua that says so.

A job spread over pools is lost whole when any one of them is reclaimed. Slurm
22.05's topology/tree would group nodes by pool, but it takes no dynamic nodes
(every job is refused: "Requested node configuration is not available"). A
matching OR does take them: `--constraint='[pool-a|pool-b]'` puts all of a job's
nodes on ONE of those features, the first listed that fits, and the job waits
when no single pool has room. The job_submit/lua plugin (`JobSubmitPlugins=lua`,
`job_submit.lua` next to slurm.conf) adds that constraint to every job that
needs it, so users write nothing.

Which jobs: those submitted to sco's Slurm partitions (every partition the job
names must be one of them: a job that may run elsewhere keeps its features, as
nodes there carry no pool feature), that may span nodes, and that do not choose
a pool themselves. A job may span nodes when it asks for more than one node
(`-N2`, or `-N1-3`: min_nodes or max_nodes above 1), or, giving no node count
(min_nodes is NO_VAL then), more than one task (`-n2`): the tasks may not fit one
node, and a bracket on a job that does fit one costs nothing, since every node
of sco's carries one of the pools. A job of one task and no node count, or of
`-N1`, is left alone. A job that names a feature starting `pool-` (every pool
feature does: `nodes.pool_feature`) or a '[' of its own has chosen; adding a
bracket to it could only make it wait for nothing. The bracket holds every pool
of the partitions, spot and guaranteed, so `--constraint=guaranteed` still
finds its nodes: `(guaranteed)&[...]`.

Every feature in the bracket must be on a live node or a FUTURE placeholder,
else Slurm refuses the job ("Invalid feature specification"):
`nodes.slurm_conf_lines(..., pools=...)` puts them on the placeholders.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_FEATURE = re.compile(r"^[A-Za-z0-9_-]+$")
_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+$")

_HEAD = """\
-- sco: every job of many nodes in sco's Slurm partitions runs on nodes of ONE pool.
-- Written by `sco slurm job-submit`; install it next to slurm.conf, with
-- JobSubmitPlugins=lua in slurm.conf, then `scontrol reconfigure`.
--
-- A job that may span nodes (min_nodes or max_nodes above 1; without a node count,
-- more than one task), submitted only to the partitions below, whose features name
-- no pool ("pool-...") and no '[' of their own, gets the matching OR
-- "[pool-x|pool-y|...]" (or "(<its features>)&[...]"): Slurm puts all its nodes on
-- one of those features, the first listed that fits, or the job waits. Any other job
-- is left as submitted; so is every job, should this script fail.
"""

_BODY = """
local function set(n)
  return n ~= nil and n ~= slurm.NO_VAL
end

-- The pools of the job's partitions, in order; nil unless every one is sco's.
local function pools_of(partition)
  local names = partition
  if names == nil or names == "" then
    if DEFAULT == nil then return nil end
    names = DEFAULT
  end
  local out, seen = {}, {}
  for name in string.gmatch(names, "[^,]+") do
    local list = POOLS[name]
    if list == nil then return nil end
    for _, pool in ipairs(list) do
      if not seen[pool] then
        seen[pool] = true
        table.insert(out, pool)
      end
    end
  end
  if #out == 0 then return nil end
  return out
end

-- The most nodes a job of the job's partitions may ask for and be kept in one pool.
local function widest_of(partition)
  local names = partition
  if names == nil or names == "" then names = DEFAULT end
  if names == nil then return nil end
  local most = nil
  for name in string.gmatch(names, "[^,]+") do
    local w = WIDEST[name]
    if w ~= nil and (most == nil or w < most) then most = w end
  end
  return most
end

local function many_nodes(job_desc, widest)
  if set(job_desc.min_nodes) then
    -- One wider than any pool would wait forever in one: it may span them.
    if widest ~= nil and job_desc.min_nodes > widest then return false end
    if job_desc.min_nodes > 1 then return true end
  elseif set(job_desc.num_tasks) and job_desc.num_tasks > 1 then
    return true
  end
  return set(job_desc.max_nodes) and job_desc.max_nodes > 1
end

local function chosen(features)
  if string.find(features, "[", 1, true) then return true end
  for word in string.gmatch(features, "[^&|,%[%]%(%)%*%s]+") do
    if string.sub(word, 1, 5) == "pool-" then return true end
  end
  return false
end

local function one_pool(job_desc, submit_uid)
  local pools = pools_of(job_desc.partition)
  if pools == nil or not many_nodes(job_desc, widest_of(job_desc.partition)) then return end
  local features = job_desc.features
  if features ~= nil and features ~= "" and chosen(features) then return end
  local bracket = "[" .. table.concat(pools, "|") .. "]"
  if features == nil or features == "" then
    job_desc.features = bracket
  else
    job_desc.features = "(" .. features .. ")&" .. bracket
  end
  slurm.log_info("sco one-pool: uid %s, partition %s, nodes %s-%s, tasks %s: features %s -> %s",
                 tostring(submit_uid), tostring(job_desc.partition),
                 tostring(job_desc.min_nodes), tostring(job_desc.max_nodes),
                 tostring(job_desc.num_tasks), tostring(features), job_desc.features)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, err = pcall(one_pool, job_desc, submit_uid)
  if not ok then
    slurm.log_error("sco one-pool: job left as submitted: %s", tostring(err))
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
"""


def job_submit_lua(
    pools: Mapping[str, Sequence[str]],
    default_partition: str | None = None,
    widest: Mapping[str, int] | None = None,
) -> str:
    """The job_submit.lua that keeps multi-node jobs in one pool: `pools` maps each of
    sco's Slurm partitions to its pool features, in sco's order of preference (the
    first that fits wins). `default_partition`, one of them, is where a job naming no
    partition goes (the cluster's Default=YES); without it such jobs are left alone.
    `widest`: per partition, the most nodes a job may ask for and be kept in one pool
    (one_pool_max_nodes): a wider one could never start in one, and may span pools.
    ValueError for a feature not of [A-Za-z0-9_-], a partition name Slurm would not
    take, no pools, or a default not among the partitions."""
    if not pools:
        raise ValueError("no Slurm partition to keep in one pool")
    if default_partition is not None and default_partition not in pools:
        raise ValueError(f"default partition {default_partition!r}: not one of {', '.join(pools)}")
    lines = [_HEAD, "local POOLS = {"]
    for partition, features in pools.items():
        if not _PARTITION.match(partition):
            raise ValueError(f"Slurm partition name {partition!r}: not of [A-Za-z0-9_.-]")
        if not features:
            raise ValueError(f"Slurm partition {partition}: no pool")
        for f in features:
            if not _FEATURE.match(f):
                raise ValueError(f"pool feature {f!r}: not of [A-Za-z0-9_-]")
        quoted = ", ".join(f'"{f}"' for f in dict.fromkeys(features))
        lines.append(f'  ["{partition}"] = {{{quoted}}},')
    lines.append("}")
    default = "nil" if default_partition is None else f'"{default_partition}"'
    lines.append(f"local DEFAULT = {default}  -- where a job naming no partition goes")
    most = ", ".join(f'["{p}"] = {int(n)}' for p, n in (widest or {}).items() if p in pools)
    lines.append(f"local WIDEST = {{{most}}}  -- wider jobs may span pools")
    return "\n".join(lines) + "\n" + _BODY
