#!/usr/bin/env bash
# Standalone OpenStack Placement (noauth2, SQLite) for tests and benchmarks.
#
#   SCO_OPENSTACK_VENV=/path/to/venv placement.sh up DIR PORT [WORKERS]
#   placement.sh down DIR
#
# `up` writes DIR/placement.conf, runs `placement-manage db sync` (idempotent:
# an existing DIR/placement.sqlite, e.g. one filled by placement_load.py, is
# kept), starts gunicorn under setsid (pid in DIR/placement.pid, gunicorn
# output in DIR/gunicorn.log, Placement's log in DIR/placement.log), waits
# until `GET /` answers and prints the URL as the last line of stdout.
# `down` kills the process group and waits; it is idempotent.
#
# Requests need `X-Auth-Token: admin` (noauth2 gives that token the admin role)
# and e.g. `OpenStack-API-Version: placement 1.39`.
set -euo pipefail

usage() {
    echo "usage: $0 up DIR PORT [WORKERS] | down DIR" >&2
    exit 2
}

# "Is the pid alive", without failing under set -e. A zombie counts as dead:
# the daemonized master is reparented to PID 1, which may reap it late.
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}

# Is pid $1 alive and a gunicorn master (guards against a reused pid in a
# stale pid file)?
ours() {
    alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q gunicorn
}

# Any non-zombie process left in process group $1?
group_alive() {
    local p
    for p in $(pgrep -g "$1" 2>/dev/null); do
        alive "$p" && return 0
    done
    return 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd_down() {
    local dir=$1 pidfile pid _
    pidfile="$dir/placement.pid"
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    case $pid in '' | *[!0-9]*) rm -f "$pidfile"; return 0 ;; esac
    if ! ours "$pid"; then
        rm -f "$pidfile"   # stale: already gone (or the pid was reused)
        return 0
    fi
    if alive "$pid"; then
        # setsid made the gunicorn master a process-group leader: kill the group
        # (master and workers).
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            kill -KILL -- "-$pid" 2>/dev/null || true
            for _ in $(seq 1 50); do
                alive "$pid" || break
                sleep 0.1
            done
        fi
    fi
    # Workers can outlive the master by a moment.
    for _ in $(seq 1 50); do
        group_alive "$pid" || break
        sleep 0.1
    done
    pkill -KILL -g "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

cmd_up() {
    local dir=$1 port=$2 workers=${3:-1}
    local venv=${SCO_OPENSTACK_VENV:-}
    if [ -z "$venv" ]; then
        echo "placement.sh: SCO_OPENSTACK_VENV is not set (path of a venv with openstack-placement and gunicorn)" >&2
        exit 2
    fi
    local bin
    for bin in placement-manage gunicorn; do
        if [ ! -x "$venv/bin/$bin" ]; then
            echo "placement.sh: $venv/bin/$bin not found (SCO_OPENSTACK_VENV=$venv)" >&2
            exit 2
        fi
    done
    case $port in '' | *[!0-9]*) echo "placement.sh: bad PORT '$port'" >&2; exit 2 ;; esac
    case $workers in '' | *[!0-9]* | 0*) echo "placement.sh: bad WORKERS '$workers' (want >= 1)" >&2; exit 2 ;; esac

    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/placement.pid" ] && ours "$(cat "$dir/placement.pid")"; then
        echo "placement.sh: already running in $dir (pid $(cat "$dir/placement.pid")); run '$0 down $dir' first" >&2
        exit 1
    fi
    rm -f "$dir/placement.pid"
    if port_open "$port"; then
        echo "placement.sh: something already listens on 127.0.0.1:$port" >&2
        exit 1
    fi

    cat >"$dir/placement.conf" <<EOF
[DEFAULT]
log_file = $dir/placement.log
[api]
auth_strategy = noauth2
[placement_database]
connection = sqlite:///$dir/placement.sqlite
EOF

    if ! "$venv/bin/placement-manage" --config-file "$dir/placement.conf" db sync \
        >"$dir/db-sync.log" 2>&1; then
        echo "placement.sh: placement-manage db sync failed:" >&2
        tail -n 30 "$dir/db-sync.log" >&2
        exit 1
    fi

    # setsid: own session and process group, so `down` can kill the group and
    # the server survives the caller's shell. stdin from /dev/null so callers
    # that capture our stdout are not held open.
    # gunicorn >= 27 opens a control socket at a fixed per-user path
    # (~/.gunicorn/gunicorn.ctl) that concurrent instances would share.
    local extra=()
    if "$venv/bin/gunicorn" --help 2>/dev/null | grep -q -- --no-control-socket; then
        extra+=(--no-control-socket)
    fi

    # The pid is written from inside the new session (setsid may fork), so it
    # is both gunicorn's master pid and the process-group id.
    rm -f "$dir/placement.pid.tmp"
    # shellcheck disable=SC2016  # $$, $1, $@ are for the inner sh
    OS_PLACEMENT_CONFIG_DIR="$dir" setsid sh -c \
        'echo $$ >"$1/placement.pid.tmp"; shift; exec "$@"' sh "$dir" \
        "$venv/bin/gunicorn" -w "$workers" -b "127.0.0.1:$port" --timeout 120 ${extra[@]+"${extra[@]}"} \
        placement.wsgi.api:application \
        </dev/null >>"$dir/gunicorn.log" 2>&1 &
    local pid="" _
    for _ in $(seq 1 50); do
        [ -s "$dir/placement.pid.tmp" ] && pid=$(cat "$dir/placement.pid.tmp") && break
        sleep 0.1
    done
    if [ -z "$pid" ]; then
        echo "placement.sh: gunicorn did not start" >&2
        tail -n 30 "$dir/gunicorn.log" >&2 || true
        exit 1
    fi
    mv "$dir/placement.pid.tmp" "$dir/placement.pid"

    local url="http://127.0.0.1:$port" deadline=$((SECONDS + 30))
    while :; do
        if ! alive "$pid"; then
            echo "placement.sh: gunicorn (pid $pid) exited during start-up" >&2
            break
        fi
        if "$venv/bin/python" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2).read()' "$url/" 2>/dev/null; then
            echo "$url"
            return 0
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "placement.sh: $url/ did not answer within 30 s" >&2
            break
        fi
        sleep 0.1
    done
    echo "--- $dir/gunicorn.log (tail)" >&2
    tail -n 30 "$dir/gunicorn.log" >&2 || true
    echo "--- $dir/placement.log (tail)" >&2
    tail -n 30 "$dir/placement.log" >&2 2>/dev/null || true
    cmd_down "$dir"
    exit 1
}

[ $# -ge 1 ] || usage
case $1 in
    up)
        if [ $# -lt 3 ] || [ $# -gt 4 ]; then usage; fi
        cmd_up "$2" "$3" "${4:-1}"
        ;;
    down)
        [ $# -eq 2 ] || usage
        cmd_down "$2"
        ;;
    *) usage ;;
esac
