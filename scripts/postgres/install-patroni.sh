#!/usr/bin/env bash
# Patroni and etcd for the failover tests, from Debian, only when missing; with
# the PostgreSQL server binaries (install.sh). Never starts system services.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
missing=()
command -v patroni >/dev/null || missing+=(patroni)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v etcdctl >/dev/null || missing+=(etcd-client)
if [ ${#missing[@]} -gt 0 ]; then
    echo "[patroni] installing ${missing[*]} from Debian" >&2
    rcd=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$rcd" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$rcd" && chmod 755 "$rcd" && created=1
    fi
    apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -q
         install -y --no-install-recommends "${missing[@]}")
    "${apt[@]}" >&2 || { apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && "${apt[@]}" >&2; }
    [ "$created" = 1 ] && rm -f "$rcd"
fi
bash "$here/install.sh"
