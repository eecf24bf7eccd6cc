#!/usr/bin/env bash
# Throw-away OpenStack (Nova + Placement + Glance + Neutron API, fake virt
# driver, no Keystone) for integration tests. Everything runs loopback-only
# from DIR; see README.md.
#
#   nova.sh up DIR                  (stdout: path of DIR/stack.env)
#   nova.sh add-compute DIR HOST [SPOT_SLOTS] [EXTRA_TRAITS...]
#                                   (stdout: the compute's resource provider uuid)
#   nova.sh down DIR
#   nova.sh status DIR
#
# Ports: base = ${SCO_OS_BASE_PORT:-18700}
#   +0 nova-api (compute, /v2.1)   +4 MariaDB
#   +1 placement                   +5 RabbitMQ AMQP
#   +2 glance (image)              +6 RabbitMQ Erlang distribution
#   +3 neutron (network)           +7 epmd (private, for this RabbitMQ only)
#   (+8 keystone in Keystone mode, +9 ironic in Ironic mode)
#
# Env: SCO_OS_BASE_PORT, SCO_OPENSTACK_VENV (see install.sh),
#      SCO_OS_SKIP_INSTALL=1 (use $SCO_OPENSTACK_VENV as is, no install.sh),
#      SCO_OS_TIMEOUT (s, per wait; default 180),
#      SCO_OS_KEEP_ON_FAILURE=1 (leave a failed stack running to debug),
#      SCO_OS_API_WORKERS (gunicorn workers for nova-api and placement, 2),
#      SCO_OS_CONDUCTOR_WORKERS (2), SCO_OS_DEBUG=1 (debug logging),
#      SCO_OS_KEYSTONE=1 (opt-in: real Keystone on +8 and keystonemiddleware
#      authtoken in nova/placement/glance/neutron instead of sco_noauth),
#      SCO_OS_TOKEN_CACHE_TIME (Keystone mode; default 300, -1 = no cache),
#      SCO_OS_IRONIC=1 (opt-in: real Ironic, fake-hardware, API+conductor in
#      one process on +9, plus a nova-compute `ironic` with the ironic virt
#      driver; `up` enrolls the nodes and waits for their providers),
#      SCO_OS_IRONIC_NODES (4), SCO_OS_IRONIC_RC (node resource_class,
#      baremetal-gpu -> CUSTOM_BAREMETAL_GPU), SCO_OS_IRONIC_TRAITS (CUSTOM_*
#      node traits, comma-separated; they become provider traits),
#      SCO_OS_IRONIC_CLEAN=1 (automated cleaning on delete), SCO_OS_IRONIC_DEPLOY_DELAY,
#      SCO_OS_IRONIC_CLEAN_DELAY (fake driver delays, s; default 0),
#      SCO_OS_IRONIC_RESOURCES_INTERVAL (ironic compute's resource update, s; 2).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIB="$HERE/lib"
T0=${EPOCHREALTIME/./}
TP=$T0
TIMEOUT=${SCO_OS_TIMEOUT:-180}
MARKER=.sco-openstack-stack
DB_USER=sco
DB_PASS=sco-secret
KEYSTONE=${SCO_OS_KEYSTONE:-0}
ADMIN_PASS=admin-secret          # Keystone mode: user admin, project admin
SERVICE_PASS=service-secret      # Keystone mode: users nova/placement/glance/neutron
IRONIC=${SCO_OS_IRONIC:-0}
IRONIC_HOST=ironic               # the nova-compute host that owns every Ironic node

fmt_us() { printf '%d.%01d' $(($1 / 1000000)) $(($1 % 1000000 / 100000)); }
log() { printf '[nova.sh %5ss] %s\n' "$(fmt_us $(( ${EPOCHREALTIME/./} - T0 )))" "$*" >&2; }
phase() {  # phase NAME: time since the previous phase
    local now=${EPOCHREALTIME/./}
    printf '[nova.sh] phase %-26s %6ss  (total %6ss)\n' "$1" \
        "$(fmt_us $((now - TP)))" "$(fmt_us $((now - T0)))" >&2
    TP=$now
}
die() { printf '[nova.sh] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

# The stack's parts, sourced from lib/ beside this script (each file says what
# it holds); they define functions and constants only.
# shellcheck source=lib/nova_layout.sh
. "$LIB/nova_layout.sh"
# shellcheck source=lib/nova_procs.sh
. "$LIB/nova_procs.sh"
# shellcheck source=lib/nova_configs.sh
. "$LIB/nova_configs.sh"
# shellcheck source=lib/nova_services.sh
. "$LIB/nova_services.sh"

# ------------------------------------------------------------- venv -------
ensure_venv() {
    if [ "${SCO_OS_SKIP_INSTALL:-0}" = 1 ]; then
        [ -n "${SCO_OPENSTACK_VENV:-}" ] || die "SCO_OS_SKIP_INSTALL=1 needs SCO_OPENSTACK_VENV"
        VENV=$SCO_OPENSTACK_VENV
    else
        VENV=$("$HERE/install.sh" | tail -n 1) || die "install.sh failed"
    fi
    [ -x "$VENV/bin/nova-manage" ] || die "$VENV has no nova-manage; run install.sh"
    PY=$VENV/bin/python
    BIN=$VENV/bin
}

stackctl() { "$PY" "$LIB/stackctl.py" "$@"; }

# ----------------------------------------------------------------- up -----
cmd_up() {
    [ $# -eq 1 ] || usage
    set_layout "$1"
    set_ports
    [ "$IRONIC" = 1 ] && set_ironic
    local wipe=0
    if [ -n "$(ls -A "$DIR")" ]; then
        [ -e "$DIR/$MARKER" ] || die "$DIR is not empty and was not made by nova.sh; refusing to use it"
        [ -z "$(stack_alive_groups)" ] || die "a stack is still running in $DIR; run: $0 down $DIR"
        wipe=1
    fi
    local p busy=()
    for p in $NOVA_PORT $PLACEMENT_PORT $GLANCE_PORT $NEUTRON_PORT $DB_PORT $AMQP_PORT $DIST_PORT $EPMD_PORT \
             ${KEYSTONE_URL:+$KEYSTONE_PORT} ${IRONIC_URL:+$IRONIC_PORT}; do
        port_busy "$p" && busy+=("$p")
    done
    [ ${#busy[@]} -eq 0 ] || die "ports already in use: ${busy[*]} (set SCO_OS_BASE_PORT to a free range of 8)"
    if [ "$wipe" = 1 ]; then
        log "wiping the previous stack in $DIR"
        find "$DIR" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    fi
    : > "$DIR/$MARKER"
    mkdir -p "$LOGS" "$RUN"
    # Every program started from here on carries this marker, so that a
    # Ctrl-C / kill of `up` (trap below) or a later `down` finds it.
    export SCO_OS_STACK_DIR="$DIR"
    CHAIN_JOBS=()
    trap on_abort INT TERM

    ensure_venv
    phase "venv+apt ready"
    write_stack_env 0
    write_configs

    start_mariadb
    start_rabbitmq
    stackctl mysql-init --socket "$DB_SOCKET" --user "$DB_USER" --password "$DB_PASS" \
        --timeout "$TIMEOUT" --pid "$(svc_pid mariadb)" \
        --database placement --database glance --database neutron \
        --database nova_api --database nova_cell0 --database nova_cell1 \
        ${KEYSTONE_URL:+--database keystone} ${IRONIC_URL:+--database ironic} \
        || fail "MariaDB did not come up" mariadb
    phase "mariadb up"

    rm -f "$RUN"/*.failed
    local j
    chain_placement & CHAIN_JOBS+=($!)
    chain_glance & CHAIN_JOBS+=($!)
    chain_neutron & CHAIN_JOBS+=($!)
    chain_nova & CHAIN_JOBS+=($!)
    if [ "$KEYSTONE" = 1 ]; then
        mkdir -p "$DATA/keystone"
        chain_keystone & CHAIN_JOBS+=($!)
    fi
    [ "$IRONIC" = 1 ] && { chain_ironic & CHAIN_JOBS+=($!); }
    for j in "${CHAIN_JOBS[@]}"; do wait "$j" || true; done
    CHAIN_JOBS=()
    local failed=()
    for p in placement glance neutron nova keystone ironic; do
        [ -e "$RUN/sync-$p.failed" ] && failed+=("sync-$p")
    done
    [ ${#failed[@]} -eq 0 ] || fail "schema sync failed: ${failed[*]}" "${failed[@]}"
    [ -e "$RUN/rabbitmq.failed" ] && fail "RabbitMQ did not come up" rabbitmq
    phase "schemas synced, started"
    # stackctl (wait-http, create-image, wait-compute) fetches a real admin token
    export SCO_OS_KEYSTONE_URL=$KEYSTONE_URL SCO_OS_ADMIN_PASSWORD=$ADMIN_PASS

    wait_http placement "$PLACEMENT_URL/resource_providers" --header 'OpenStack-API-Version: placement 1.39'
    wait_http glance "$GLANCE_URL/v2/images"
    wait_http neutron "$NEUTRON_URL/v2.0/ports"
    wait_http nova-api "$NOVA_URL/flavors"
    phase "APIs answering"
    stackctl wait-nova-services "$NOVA_URL" --binary nova-conductor --binary nova-scheduler \
        --timeout "$TIMEOUT" --pid "$(svc_pid nova-conductor)" --pid "$(svc_pid nova-scheduler)" \
        || fail "nova-conductor/nova-scheduler did not report up" nova-conductor nova-scheduler
    phase "conductor+scheduler up"
    if [ "$IRONIC" = 1 ]; then
        if [ "$KEYSTONE" = 1 ]; then
            enroll_ironic "${EPOCHREALTIME/./}" || fail "could not enroll the Ironic nodes" ironic
        fi
        start_ironic_compute
        phase "ironic compute, $IRONIC_NODES providers"
    fi

    IMAGE_ID=$(stackctl create-image "$GLANCE_URL" cirros-fake) \
        || fail "could not create image cirros-fake" glance
    write_clouds_yaml
    write_stack_env 1
    phase "image, clouds.yaml"
    trap - INT TERM
    echo "$DIR/stack.env"
    log "stack up in $DIR (compute $NOVA_URL); now: $0 add-compute $DIR HOST [SPOT_SLOTS] [TRAITS...]"
}

# -------------------------------------------------------- add-compute -----
cmd_add_compute() {
    [ $# -ge 2 ] || usage
    local dir=$1 host=$2 spot=${3:-0}
    shift $(( $# >= 3 ? 3 : 2 ))
    local traits=("$@") t
    load_stack_env "$dir"
    [[ $host =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$ ]] || die "bad host name '$host'"
    [[ $spot =~ ^[0-9]+$ ]] || die "SPOT_SLOTS must be a non-negative integer (got '$spot')"
    for t in "${traits[@]}"; do
        [[ $t =~ ^CUSTOM_[A-Z0-9_]{1,248}$ ]] || die "trait '$t' must look like CUSTOM_[A-Z0-9_]+"
    done
    [ -n "$(stack_alive_groups)" ] || die "no stack running in $DIR"
    local name="nova-compute-$host"
    [ ! -e "$RUN/$name.pid" ] && [ ! -e "$DATA/computes/$host" ] \
        || die "compute $host was already started in this stack (fake computes cannot reuse a host name)"

    local pdir="$ETC/nova/provider-$host"
    mkdir -p "$pdir" "$DATA/computes/$host/instances"
    if [ "$spot" -gt 0 ]; then
        traits=(CUSTOM_SPOT_CAPABLE "${traits[@]}")
    fi
    [ ${#traits[@]} -eq 0 ] || mapfile -t traits < <(printf '%s\n' "${traits[@]}" | awk '!seen[$0]++')
    if [ "$spot" -gt 0 ] || [ ${#traits[@]} -gt 0 ]; then
        {
            echo "meta:"
            echo "  schema_version: '1.0'"
            echo "providers:"
            echo "  - identification:"
            echo "      uuid: '\$COMPUTE_NODE'"
            if [ "$spot" -gt 0 ]; then
                echo "    inventories:"
                echo "      additional:"
                echo "        - CUSTOM_SPOT_SLOT:"
                echo "            total: $spot"
                echo "            reserved: 0"
                echo "            min_unit: 1"
                echo "            max_unit: $spot"
                echo "            step_size: 1"
                echo "            allocation_ratio: 1.0"
            fi
            if [ ${#traits[@]} -gt 0 ]; then
                echo "    traits:"
                echo "      additional:"
                for t in "${traits[@]}"; do echo "        - $t"; done
            fi
        } > "$pdir/sco.yaml"
    fi
    cat > "$ETC/nova/compute-$host.conf" <<EOF
[DEFAULT]
host = $host
state_path = $DATA/computes/$host
instances_path = $DATA/computes/$host/instances
log_file = $LOGS/$name.log
compute_driver = fake.SmallFakeDriver
[compute]
provider_config_location = $pdir/
EOF
    start_svc "$name" "$BIN/nova-compute" --config-file "$ETC/nova/nova.conf" \
        --config-file "$ETC/nova/compute-$host.conf"
    local args=() uuid
    for t in "${traits[@]}"; do args+=(--trait "$t"); done
    uuid=$(stackctl wait-compute --placement "$PLACEMENT_URL" --host "$host" --spot "$spot" \
        "${args[@]}" --db-port "$DB_PORT" --db-user "$DB_USER" --db-password "$DB_PASS" \
        --timeout "$TIMEOUT" --pid "$(svc_pid "$name")") || {
        printf '[nova.sh] ERROR: compute %s did not register within %ss\n' "$host" "$TIMEOUT" >&2
        show_logs "$name" nova-scheduler
        local pid; pid=$(svc_pid "$name")
        [ "${SCO_OS_KEEP_ON_FAILURE:-0}" = 1 ] || kill -KILL -- "-$pid" 2>/dev/null || true
        exit 1
    }
    phase "add-compute $host"
    log "compute $host: resource provider $uuid, mapped to cell1"
    echo "$uuid"
}

# ---------------------------------------------------------------- down ----
cmd_down() {
    [ $# -eq 1 ] || usage
    [ -d "$1" ] || { log "nothing to stop: $1 does not exist"; return 0; }
    set_layout "$1"
    [ -e "$DIR/$MARKER" ] || [ -d "$RUN" ] || { log "no stack in $DIR"; return 0; }
    kill_stack
    [ -f "$DIR/stack.env" ] && sed -i 's/^export SCO_OS_READY=1$/export SCO_OS_READY=0/' "$DIR/stack.env"
    phase "down"
}

cmd_status() {
    [ $# -eq 1 ] || usage
    set_layout "$1"
    local f pid st n live
    live=" $(stack_alive_groups | tr '\n' ' ') "
    for f in "$RUN"/*.pid; do
        [ -e "$f" ] || continue
        n=$(basename "$f" .pid)
        read -r pid st < "$f"
        if [[ $live == *" $pid "* ]]; then echo "$n $pid running"; else echo "$n $pid dead"; fi
    done
}

[ $# -ge 1 ] || usage
cmd=$1; shift
case "$cmd" in
    up) cmd_up "$@" ;;
    add-compute) cmd_add_compute "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    -h|--help|help) usage ;;
    *) usage ;;
esac
