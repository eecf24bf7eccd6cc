#!/usr/bin/env bash
# Slurm 22.05 (Debian's slurm-wlm), munge, and slurmdbd with MariaDB for accounting,
# for the Slurm tier's real daemons. The fixtures start them (slurmctld, one slurmd per
# node in a network namespace, slurmdbd on a MariaDB of its own); nothing is started
# here. Idempotent and quiet when everything is there.
set -euo pipefail
need=()
for tool in slurmctld slurmd slurmdbd sinfo sacct munged mariadbd ip; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
    echo "[slurm] installing Slurm, munge, MariaDB (missing: ${need[*]})" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
    apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends \
        slurmctld slurmd slurmdbd slurm-client munge mariadb-server iproute2 >/dev/null
fi
# The package's own services are not used (they may not even start in a container).
[ -s /etc/munge/munge.key ] || { echo "[slurm] no /etc/munge/munge.key" >&2; exit 1; }
