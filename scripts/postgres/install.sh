#!/usr/bin/env bash
# Makes PostgreSQL server binaries available for the tests: uses an installed
# server (/usr/lib/postgresql/N/bin) or installs Debian's postgresql package.
# Never starts the system cluster. Prints the bin directory as its last line.
set -euo pipefail

find_bin() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

if ! bin=$(find_bin); then
    echo "[postgres] installing the PostgreSQL server from Debian" >&2
    rcd=/usr/sbin/policy-rc.d created=0
    if [ ! -e "$rcd" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$rcd" && chmod 755 "$rcd" && created=1
    fi
    apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 -q
         install -y --no-install-recommends postgresql)
    "${apt[@]}" >&2 || { apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && "${apt[@]}" >&2; }
    [ "$created" = 1 ] && rm -f "$rcd"
    bin=$(find_bin) || { echo "[postgres] no server binaries after install" >&2; exit 1; }
fi
id postgres >/dev/null 2>&1 || { echo "[postgres] no 'postgres' user to run the server as" >&2; exit 1; }
echo "$bin"
