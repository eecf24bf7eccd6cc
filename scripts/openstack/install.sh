#!/usr/bin/env bash
# Install what the OpenStack test stack needs; idempotent and cheap when done.
#
#   install.sh            -> prints the venv path as the last stdout line
#
# (a) Debian packages mariadb-server and rabbitmq-server (only when missing;
#     their services are never started by apt: we install a policy-rc.d
#     guard for the duration of the install if none exists).
# (b) A venv with requirements.txt at
#     ${SCO_OPENSTACK_VENV:-$HOME/.cache/sco/openstack-venv-<sha12>}
#     where <sha12> is the first 12 hex digits of sha256(requirements.txt).
#     A marker file is written after a successful install; with the marker
#     present nothing is run again.
#
# Env: SCO_OPENSTACK_VENV   venv path override
#      SCO_OS_SKIP_APT=1    do not touch apt (packages must already be there)
#      SCO_OS_PYTHON        interpreter for the venv (default: python3)
# Progress goes to stderr; stdout carries only the venv path.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REQ="$HERE/requirements.txt"
T0=${EPOCHREALTIME/./}

log() {
    local us=$(( ${EPOCHREALTIME/./} - T0 ))
    printf '[install %4d.%01ds] %s\n' $((us / 1000000)) $((us % 1000000 / 100000)) "$*" >&2
}
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- apt ----
APT_PKGS=(mariadb-server rabbitmq-server)

pkg_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = installed ]
}

ensure_apt() {
    local missing=() p
    for p in "${APT_PKGS[@]}"; do pkg_installed "$p" || missing+=("$p"); done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "${SCO_OS_SKIP_APT:-0}" = 1 ] && die "missing Debian packages: ${missing[*]} (SCO_OS_SKIP_APT=1)"
    command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
    local SUDO=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${missing[*]}"
        SUDO=(sudo)
    fi
    log "apt-get install ${missing[*]}"
    # Never let the package scripts start the system services: they would
    # listen on the default ports and are of no use to the test stack.
    local rcd=/usr/sbin/policy-rc.d created_rcd=0
    if [ ! -e "$rcd" ]; then
        "${SUDO[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $rcd && chmod 755 $rcd"
        created_rcd=1
    fi
    local apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get
               -o DPkg::Lock::Timeout=300 -q install -y --no-install-recommends)
    local rc=0
    if ! "${apt[@]}" "${missing[@]}" >&2; then
        log "install failed; running apt-get update first"
        "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 update -q >&2 \
            && "${apt[@]}" "${missing[@]}" >&2 || rc=$?
    fi
    [ "$created_rcd" = 1 ] && "${SUDO[@]}" rm -f "$rcd"
    [ "$rc" = 0 ] || die "apt-get install ${missing[*]} failed (rc=$rc)"
    log "apt done"
}

# --------------------------------------------------------------- venv ----
ensure_venv() {
    [ -f "$REQ" ] || die "missing $REQ"
    local sha venv marker py
    sha=$(sha256sum "$REQ" | cut -c1-64)
    venv=${SCO_OPENSTACK_VENV:-$HOME/.cache/sco/openstack-venv-${sha:0:12}}
    marker="$venv/.sco-openstack-installed"
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$sha" ] \
            && "$venv/bin/python" -c '' 2>/dev/null; then
        log "venv cached: $venv"
        VENV=$venv
        return 0
    fi
    py=${SCO_OS_PYTHON:-python3}
    command -v "$py" >/dev/null || die "$py not found"
    if [ ! -x "$venv/bin/python" ]; then
        log "creating venv $venv"
        mkdir -p "$(dirname "$venv")"
        "$py" -m venv "$venv" >&2 || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    rm -f "$marker"
    log "pip install -r requirements.txt (a cold install takes about a minute)"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$REQ" >&2 \
        || die "pip install into $venv failed"
    echo "$sha" > "$marker"
    log "venv ready: $venv"
    VENV=$venv
}

ensure_apt
ensure_venv
echo "$VENV"
