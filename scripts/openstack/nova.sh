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

# ------------------------------------------------------------- layout ----
set_layout() {  # set_layout DIR (DIR need not exist)
    mkdir -p "$1"
    DIR=$(cd "$1" && pwd)
    ETC=$DIR/etc LOGS=$DIR/logs RUN=$DIR/run DATA=$DIR/data
}

set_ports() {
    BASE=${SCO_OS_BASE_PORT:-18700}
    [[ $BASE =~ ^[0-9]+$ ]] && [ "$BASE" -ge 1024 ] && [ "$BASE" -le 65520 ] \
        || die "SCO_OS_BASE_PORT must be a number in 1024..65520 (got '$BASE')"
    NOVA_PORT=$BASE PLACEMENT_PORT=$((BASE + 1)) GLANCE_PORT=$((BASE + 2))
    NEUTRON_PORT=$((BASE + 3)) DB_PORT=$((BASE + 4)) AMQP_PORT=$((BASE + 5))
    DIST_PORT=$((BASE + 6)) EPMD_PORT=$((BASE + 7))
    NOVA_URL=http://127.0.0.1:$NOVA_PORT/v2.1
    PLACEMENT_URL=http://127.0.0.1:$PLACEMENT_PORT
    GLANCE_URL=http://127.0.0.1:$GLANCE_PORT
    NEUTRON_URL=http://127.0.0.1:$NEUTRON_PORT
    TRANSPORT_URL=rabbit://guest:guest@127.0.0.1:$AMQP_PORT/
    DB_SOCKET=$RUN/mysqld.sock
    KEYSTONE_PORT=$((BASE + 8))
    KEYSTONE_URL=
    [ "$KEYSTONE" = 1 ] && KEYSTONE_URL=http://127.0.0.1:$KEYSTONE_PORT
    IRONIC_PORT=$((BASE + 9))
    IRONIC_URL=
    [ "$IRONIC" = 1 ] && IRONIC_URL=http://127.0.0.1:$IRONIC_PORT
    return 0
}

set_ironic() {  # Ironic mode: node count, resource class and traits
    IRONIC_NODES=${SCO_OS_IRONIC_NODES:-4}
    IRONIC_RC=${SCO_OS_IRONIC_RC:-baremetal-gpu}
    [[ $IRONIC_NODES =~ ^[0-9]+$ ]] && [ "$IRONIC_NODES" -ge 1 ] \
        || die "SCO_OS_IRONIC_NODES must be a positive integer (got '$IRONIC_NODES')"
    [[ $IRONIC_RC =~ ^[A-Za-z0-9_.-]{1,80}$ ]] || die "bad SCO_OS_IRONIC_RC '$IRONIC_RC'"
    # Placement's name, as nova's ironic driver makes it (nova.utils.
    # normalize_rc_name): runs of non-alphanumerics -> _, upper case, and
    # always a CUSTOM_ prefix (so do not start SCO_OS_IRONIC_RC with custom-)
    IRONIC_PRC=CUSTOM_$(printf '%s' "$IRONIC_RC" | sed -E 's/[^0-9A-Za-z]+/_/g' | tr 'a-z' 'A-Z')
    IRONIC_TRAITS=${SCO_OS_IRONIC_TRAITS:-}
    local t
    for t in ${IRONIC_TRAITS//,/ }; do
        [[ $t =~ ^CUSTOM_[A-Z0-9_]{1,248}$ ]] || die "Ironic trait '$t' must look like CUSTOM_[A-Z0-9_]+"
    done
}

db_url() { echo "mysql+pymysql://$DB_USER:$DB_PASS@127.0.0.1:$DB_PORT/$1?charset=utf8"; }

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ------------------------------------------------------ process groups ----
# Every daemon is started with setsid, so its pid is also its process group
# and session id. run/NAME.pid holds "PID STARTTIME" (STARTTIME from
# /proc/PID/stat) so that a stale file never makes us signal a reused pid.
proc_starttime() {
    local line
    read -r line 2>/dev/null < "/proc/$1/stat" || return 1
    line=${line##*) }
    set -- $line
    echo "${20}"
}

start_svc() {  # start_svc NAME CMD... (env prepared by caller)
    local name=$1; shift
    (
        export SCO_OS_STACK_DIR="$DIR" PYTHONPATH="$LIB${PYTHONPATH:+:$PYTHONPATH}"
        exec setsid "$@" >>"$LOGS/$name.out" 2>&1 </dev/null
    ) &
    local pid=$! st
    # The subshell is not a group leader, so setsid does not fork: this pid
    # is the daemon itself and its process group and session id.
    st=$(proc_starttime "$pid") || st=0
    echo "$pid $st" > "$RUN/$name.pid"
}

svc_pid() { local p _; read -r p _ < "$RUN/$1.pid" 2>/dev/null && echo "$p"; }

live_groups() {  # live_groups PGID...: those with a member that is not a zombie
    local want=" $* " line f fields
    declare -A seen=()
    for f in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null < "$f" || continue
        read -ra fields <<< "${line##*) }"
        # fields: 0 state, 1 ppid, 2 pgrp, 3 session
        [ "${fields[0]}" = Z ] && continue
        [[ $want == *" ${fields[2]} "* ]] && seen[${fields[2]}]=1
    done
    [ ${#seen[@]} -eq 0 ] || printf '%s\n' "${!seen[@]}"
}

stack_alive_groups() {  # prints pids of recorded groups still alive
    local f pid st cur cands=()
    for f in "$RUN"/*.pid; do
        [ -e "$f" ] || continue
        read -r pid st < "$f" || continue
        [[ $pid =~ ^[0-9]+$ ]] || continue
        if [ -e "/proc/$pid" ]; then
            cur=$(proc_starttime "$pid") || cur=
            [ "$st" = 0 ] || [ "$cur" = "$st" ] || continue   # pid reused
        fi
        cands+=("$pid")
    done
    [ ${#cands[@]} -eq 0 ] || live_groups "${cands[@]}"
}

kill_stack() {
    [ -d "$RUN" ] || return 0
    local groups=() g p i
    mapfile -t groups < <(stack_alive_groups)
    if [ ${#groups[@]} -gt 0 ]; then
        log "stopping ${#groups[@]} process groups"
        for g in "${groups[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
        local left=()
        for ((i = 0; i < ${SCO_OS_STOP_TIMEOUT:-1} * 10; i++)); do
            mapfile -t left < <(live_groups "${groups[@]}")
            [ ${#left[@]} -eq 0 ] && break
            sleep 0.1
        done
        if [ ${#left[@]} -gt 0 ]; then
            log "sending KILL to groups still alive after ${SCO_OS_STOP_TIMEOUT:-1}s of TERM: ${left[*]}"
            for g in "${left[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
        fi
    fi
    # Anything that left its group but stayed in one of our sessions, or
    # carries our stack marker in its environment (e.g. an epmd spawned
    # by Erlang itself).
    local sids=" ${groups[*]} " stray=() f
    if [ ${#groups[@]} -gt 0 ]; then
        local line fields
        for p in /proc/[0-9]*/stat; do
            read -r line 2>/dev/null < "$p" || continue
            read -ra fields <<< "${line##*) }"
            [[ $sids == *" ${fields[3]} "* ]] || continue
            p=${p#/proc/}; stray+=("${p%/stat}")
        done
    fi
    while IFS= read -r f; do
        p=${f#/proc/}; p=${p%/environ}
        [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] || stray+=("$p")
    done < <(grep -lzxF "SCO_OS_STACK_DIR=$DIR" /proc/[0-9]*/environ 2>/dev/null || true)
    if [ ${#stray[@]} -gt 0 ]; then
        kill -KILL "${stray[@]}" 2>/dev/null || true
    fi
    # Wait until nothing of ours runs any more (zombies awaiting their
    # reaper do not count).
    for ((i = 0; i < 50; i++)); do
        [ ${#groups[@]} -eq 0 ] || [ -z "$(live_groups "${groups[@]}")" ] && break
        sleep 0.1
    done
    # Orphans are reaped by init; give it up to 2 s so that `ps` is clean.
    for g in "${groups[@]}"; do
        for ((i = 0; i < 20; i++)); do kill -0 -- "-$g" 2>/dev/null || break; sleep 0.1; done
    done
    rm -f "$RUN"/*.pid
}

show_logs() {  # show_logs NAME...: tail of each service's logs to stderr
    local n f
    for n in "$@"; do
        for f in "$LOGS/$n.out" "$LOGS/$n.log" "$LOGS/$n"/*; do
            [ -s "$f" ] || continue
            printf '\n----- last lines of %s -----\n' "$f" >&2
            tail -n 40 "$f" >&2
        done
    done
}

fail() {  # fail MSG SVC...: report, show logs, tear down, exit 1
    local msg=$1; shift
    printf '[nova.sh] ERROR: %s\n' "$msg" >&2
    show_logs "$@"
    if [ "${SCO_OS_KEEP_ON_FAILURE:-0}" = 1 ]; then
        printf '[nova.sh] leaving the stack running (SCO_OS_KEEP_ON_FAILURE=1); run: %s down %s\n' "$0" "$DIR" >&2
    else
        kill_stack
    fi
    exit 1
}

on_abort() {  # `up` interrupted: stop the chains and whatever was started
    trap - INT TERM
    printf '[nova.sh] interrupted; stopping the half-started stack in %s\n' "$DIR" >&2
    [ ${#CHAIN_JOBS[@]} -eq 0 ] || kill "${CHAIN_JOBS[@]}" 2>/dev/null || true
    kill_stack
    exit 130
}

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

# ----------------------------------------------------------- configs ------
write_configs() {
    local dbg=${SCO_OS_DEBUG:-0}
    [ "$dbg" = 1 ] && dbg=true || dbg=false
    mkdir -p "$ETC"/{nova,placement,glance,neutron,rabbitmq,keystone} "$LOGS" "$RUN" \
        "$DATA"/{mysql,rabbitmq,nova,computes,neutron} \
        "$DATA"/glance/{images,staging,tasks} "$LOGS/rabbitmq"

    # ---- placement
    cat > "$ETC/placement/placement.conf" <<EOF
[DEFAULT]
debug = $dbg
log_file = $LOGS/placement.log
[api]
auth_strategy = $( [ "$KEYSTONE" = 1 ] && echo keystone || echo noauth2 )
$(authtoken_section placement placement)
$(policy_section placement)
[placement_database]
connection = $(db_url placement)
max_pool_size = 10
EOF

    # ---- nova: shared part (computes load only this + their own file)
    cat > "$ETC/nova/nova.conf" <<EOF
[DEFAULT]
debug = $dbg
host = controller
my_ip = 127.0.0.1
state_path = $DATA/nova
transport_url = $TRANSPORT_URL
compute_driver = fake.SmallFakeDriver
use_rootwrap_daemon = false
# start periodic tasks at once (default: random delay up to 60 s, which
# would delay host discovery by the scheduler)
periodic_fuzzy_delay = 0
[oslo_concurrency]
lock_path = $DATA/nova/lock
[oslo_messaging_notifications]
driver = noop
[notifications]
notification_format = unversioned
[placement]
$(service_auth nova "$PLACEMENT_URL")
endpoint_override = $PLACEMENT_URL
[glance]
endpoint_override = $GLANCE_URL
[neutron]
$(service_auth nova "$NEUTRON_URL")
endpoint_override = $NEUTRON_URL
$(authtoken_section nova compute)
$(service_user_section)
$(policy_section nova)
[quota]
instances = -1
cores = -1
ram = -1
[scheduler]
discover_hosts_in_cells_interval = 2
workers = 1
[conductor]
workers = ${SCO_OS_CONDUCTOR_WORKERS:-2}
[vnc]
enabled = false
[spice]
enabled = false
[serial_console]
enabled = false
[compute]
provider_config_location = $ETC/nova/provider-none/
EOF
    mkdir -p "$ETC/nova/provider-none"
    # ---- nova: DB access (api, conductor, scheduler, nova-manage only)
    cat > "$ETC/nova/nova-db.conf" <<EOF
[api_database]
connection = $(db_url nova_api)
max_pool_size = 10
[database]
connection = $(db_url nova_cell1)
max_pool_size = 10
EOF
    cat > "$ETC/nova/nova-api.conf" <<EOF
[DEFAULT]
log_file = $LOGS/nova-api.log
EOF
    cat > "$ETC/nova/nova-cell0.conf" <<EOF
[database]
connection = $(db_url nova_cell0)
EOF
    noauth_paste "$VENV/etc/nova/api-paste.ini" "$ETC/nova/api-paste.ini"
    [ "$IRONIC" = 1 ] && write_ironic_configs
    if [ "$KEYSTONE" = 1 ]; then
        cat > "$ETC/keystone/keystone.conf" <<EOF
[DEFAULT]
debug = $dbg
log_file = $LOGS/keystone.log
[database]
connection = $(db_url keystone)
[token]
provider = fernet
expiration = 86400
[fernet_tokens]
key_repository = $DATA/keystone/fernet-keys
[fernet_receipts]
key_repository = $DATA/keystone/fernet-keys
[credential]
key_repository = $DATA/keystone/credential-keys
[identity]
password_hash_rounds = 4
EOF
    fi

    # ---- glance
    cat > "$ETC/glance/glance-api.conf" <<EOF
[DEFAULT]
debug = $dbg
log_file = $LOGS/glance.log
enabled_backends = fs:file
worker_self_reference_url = $GLANCE_URL
[glance_store]
default_backend = fs
[fs]
filesystem_store_datadir = $DATA/glance/images
[os_glance_staging_store]
filesystem_store_datadir = $DATA/glance/staging
[os_glance_tasks_store]
filesystem_store_datadir = $DATA/glance/tasks
[database]
connection = $(db_url glance)
[paste_deploy]
flavor = keystone
config_file = $ETC/glance/glance-api-paste.ini
$(authtoken_section glance image)
[oslo_concurrency]
lock_path = $DATA/glance/lock
EOF
    noauth_paste "$VENV/etc/glance/glance-api-paste.ini" "$ETC/glance/glance-api-paste.ini"

    # ---- neutron
    cat > "$ETC/neutron/neutron.conf" <<EOF
[DEFAULT]
debug = $dbg
log_file = $LOGS/neutron.log
core_plugin = ml2
service_plugins = router,port_forwarding
auth_strategy = keystone
api_paste_config = $ETC/neutron/api-paste.ini
transport_url = $TRANSPORT_URL
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
state_path = $DATA/neutron
[database]
connection = $(db_url neutron)
[oslo_concurrency]
lock_path = $DATA/neutron/lock
[oslo_messaging_notifications]
driver = noop
$(authtoken_section neutron network)
[ml2]
type_drivers = flat,vlan
tenant_network_types =
mechanism_drivers =
EOF
    noauth_paste "$VENV/etc/neutron/api-paste.ini" "$ETC/neutron/api-paste.ini"

    # ---- rabbitmq
    printf '[].\n' > "$ETC/rabbitmq/enabled_plugins"
    : > "$ETC/rabbitmq/rabbitmq-env.conf"
    cat > "$ETC/rabbitmq/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
loopback_users.guest = true
disk_free_limit.absolute = 50MB
log.console = false
log.file.level = warning
EOF
}

write_ironic_configs() {
    local dbg=${SCO_OS_DEBUG:-0} clean=false
    [ "$dbg" = 1 ] && dbg=true || dbg=false
    [ "${SCO_OS_IRONIC_CLEAN:-0}" = 1 ] && clean=true
    mkdir -p "$ETC/ironic" "$DATA/ironic/lock" "$ETC/nova/provider-$IRONIC_HOST" \
        "$DATA/computes/$IRONIC_HOST/instances"
    # One process: API (cheroot) + conductor, no RPC (rpc_transport = none),
    # fake-hardware with fake interfaces; noauth like the rest of the stack, or
    # Keystone's authtoken in Keystone mode.
    cat > "$ETC/ironic/ironic.conf" <<EOF
[DEFAULT]
debug = $dbg
log_file = $LOGS/ironic.log
host = ironic-conductor
state_path = $DATA/ironic
auth_strategy = $( [ "$KEYSTONE" = 1 ] && echo keystone || echo noauth )
rpc_transport = none
enabled_hardware_types = fake-hardware
enabled_bios_interfaces = fake
enabled_boot_interfaces = fake
enabled_console_interfaces = fake
enabled_deploy_interfaces = fake
enabled_firmware_interfaces = fake
enabled_inspect_interfaces = fake
enabled_management_interfaces = fake
enabled_power_interfaces = fake
enabled_raid_interfaces = fake
enabled_rescue_interfaces = fake
enabled_vendor_interfaces = fake
# fake-hardware has fake storage but the default storage interface is noop,
# which must be enabled (else: "Failed to register hardware types" and the
# process hangs without serving); network: noop, no neutron
enabled_network_interfaces = noop
default_network_interface = noop
enabled_storage_interfaces = noop
[api]
host_ip = 127.0.0.1
port = $IRONIC_PORT
[database]
connection = $(db_url ironic)
max_pool_size = 10
[dhcp]
dhcp_provider = none
[conductor]
# true: a deleted instance's node goes deleting -> cleaning (fake clean step
# log_passthrough, SCO_OS_IRONIC_CLEAN_DELAY s) -> available
automated_clean = $clean
[fake]
deploy_delay = ${SCO_OS_IRONIC_DEPLOY_DELAY:-0}
vendor_delay = ${SCO_OS_IRONIC_CLEAN_DELAY:-0}
[oslo_concurrency]
lock_path = $DATA/ironic/lock
$(authtoken_section ironic baremetal)
$(ironic_policy_section)
EOF
    # The ironic nova-compute: nova.conf + this file.
    cat > "$ETC/nova/compute-$IRONIC_HOST.conf" <<EOF
[DEFAULT]
host = $IRONIC_HOST
state_path = $DATA/computes/$IRONIC_HOST
instances_path = $DATA/computes/$IRONIC_HOST/instances
log_file = $LOGS/nova-compute-$IRONIC_HOST.log
compute_driver = ironic.IronicDriver
# seconds between resource updates (default 60): how soon Placement sees a
# node become available, reserved (maintenance, manageable, cleaning) or new
update_resources_interval = ${SCO_OS_IRONIC_RESOURCES_INTERVAL:-2}
[compute]
provider_config_location = $ETC/nova/provider-$IRONIC_HOST/
[ironic]
$(ironic_auth)
endpoint_override = $IRONIC_URL
# poll interval while waiting for a deploy/teardown (default 2)
api_retry_interval = 1
EOF
}

# Keystone mode: the capacity reads sco needs beyond `member`, which Nova's and
# Placement's defaults give to admins only, allowed to a role of the cloud's
# own, as docs/security.md recommends an operator do.
CAPACITY_ROLE=sco-capacity-reader
NOVA_POLICY=("os_compute_api:os-aggregates:index")
PLACEMENT_POLICY=("placement:allocation_candidates:list" "placement:resource_providers:list")

policy_section() {  # policy_section nova|placement: its policy file and [oslo_policy]
    [ "$KEYSTONE" = 1 ] || return 0
    local rule file="$ETC/$1/policy.yaml" rules
    if [ "$1" = nova ]; then rules=("${NOVA_POLICY[@]}"); else rules=("${PLACEMENT_POLICY[@]}"); fi
    : > "$file"
    for rule in "${rules[@]}"; do
        printf '"%s": "role:admin or role:%s"\n' "$rule" "$CAPACITY_ROLE" >> "$file"
    done
    printf '[oslo_policy]\npolicy_file = %s\n' "$file"
}

service_user_section() {  # Keystone mode: nova sends a service token along
    # with the user's token to glance/neutron/placement, so that access
    # rules (which name only compute) do not block nova's own calls
    [ "$KEYSTONE" = 1 ] || return 0
    echo '[service_user]'
    echo 'send_service_user_token = true'
    service_auth nova ""
}

authtoken_section() {  # Keystone mode: [keystone_authtoken] for service user $1, type $2
    [ "$KEYSTONE" = 1 ] || return 0
    cat <<EOF
[keystone_authtoken]
www_authenticate_uri = $KEYSTONE_URL/v3
auth_url = $KEYSTONE_URL/v3
auth_type = password
username = $1
password = $SERVICE_PASS
user_domain_id = default
project_name = service
project_domain_id = default
region_name = RegionOne
# the catalog has only public endpoints (default: internal)
interface = public
# needed to honour app credentials with access rules (else: 401 for them)
service_type = $2
# seconds a validated token is cached, per worker (keystonemiddleware: 300).
# -1 = validate every request: a deleted app credential is refused at once,
# but boot/delete in smoke.py take ~3x as long.
token_cache_time = ${SCO_OS_TOKEN_CACHE_TIME:-300}
EOF
}

service_auth() {  # service_auth USER URL: how nova authenticates to placement/neutron
    if [ "$KEYSTONE" = 1 ]; then
        printf 'auth_type = password\nauth_url = %s/v3\nusername = %s\npassword = %s\n' \
            "$KEYSTONE_URL" "$1" "$SERVICE_PASS"
        printf 'user_domain_id = default\nproject_name = service\nproject_domain_id = default\nregion_name = RegionOne\n'
    else
        printf 'auth_type = admin_token\nendpoint = %s\ntoken = admin\n' "$2"
    fi
}

noauth_paste() {  # copy a paste ini, swapping keystone's authtoken for ours
    if [ "$KEYSTONE" = 1 ]; then cp "$1" "$2"; return 0; fi
    sed 's/keystonemiddleware\.auth_token:filter_factory/sco_noauth:filter_factory/' "$1" > "$2"
    grep -q 'sco_noauth:filter_factory' "$2" || die "could not patch authtoken in $1"
}

# ----------------------------------------------------------- services -----
ironic_auth() {  # how nova's ironic driver reaches Ironic
    if [ "$KEYSTONE" = 1 ]; then service_auth nova ""; return 0; fi
    echo '# Ironic runs noauth: no token, fixed endpoint'
    echo 'auth_type = none'
}

ironic_policy_section() {  # Keystone mode: Ironic's legacy policies (admin role),
    # not its new defaults, which want system scope for enrolling nodes
    [ "$KEYSTONE" = 1 ] || return 0
    printf '[oslo_policy]\nenforce_scope = false\nenforce_new_defaults = false\n'
}

start_mariadb() {
    local bin_install bin_d me
    bin_install=$(command -v mariadb-install-db || echo /usr/bin/mariadb-install-db)
    bin_d=$(command -v mariadbd || echo /usr/sbin/mariadbd)
    [ -x "$bin_d" ] || die "mariadbd not found (run install.sh)"
    me=$(id -un)
    "$bin_install" --no-defaults --datadir="$DATA/mysql" --user="$me" \
        --auth-root-authentication-method=normal --skip-test-db \
        --skip-name-resolve > "$LOGS/mariadb-install.log" 2>&1 \
        || fail "mariadb-install-db failed" mariadb-install
    # SCO_OS_MYSQLD_ARGS is word-split on purpose.
    # shellcheck disable=SC2086
    start_svc mariadb "$bin_d" --no-defaults --user="$me" \
        --datadir="$DATA/mysql" --socket="$DB_SOCKET" \
        --port="$DB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$RUN/mariadbd.pidfile" --log-error="$LOGS/mariadb.log" \
        --skip-name-resolve --max-connections=1000 \
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
        --innodb-flush-method=nosync --innodb-file-per-table=0 \
        --innodb-buffer-pool-size=256M --skip-log-bin \
        --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci \
        ${SCO_OS_MYSQLD_ARGS:-}
}

start_rabbitmq() {
    local erl_epmd rmq
    erl_epmd=$(command -v epmd || echo /usr/bin/epmd)
    rmq=/usr/lib/rabbitmq/bin/rabbitmq-server   # not the /usr/sbin wrapper (it su's to rabbitmq)
    [ -x "$rmq" ] || die "$rmq not found (run install.sh)"
    # Our own epmd on a private port, loopback only, in its own group (if
    # Erlang started it, it would daemonize out of our process groups).
    ERL_EPMD_ADDRESS=127.0.0.1 start_svc epmd "$erl_epmd" -port "$EPMD_PORT" -address 127.0.0.1
    stackctl wait-port "$EPMD_PORT" --timeout 20 --pid "$(svc_pid epmd)" || fail "epmd did not start" epmd
    HOME="$DATA/rabbitmq" \
    ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_NODENAME="sco$AMQP_PORT@localhost" \
    RABBITMQ_USE_LONGNAME=false \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$AMQP_PORT \
    RABBITMQ_DIST_PORT=$DIST_PORT \
    RABBITMQ_CONF_ENV_FILE="$ETC/rabbitmq/rabbitmq-env.conf" \
    RABBITMQ_CONFIG_FILE="$ETC/rabbitmq/rabbitmq.conf" \
    RABBITMQ_ADVANCED_CONFIG_FILE="$ETC/rabbitmq/advanced.config" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$ETC/rabbitmq/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$DATA/rabbitmq/mnesia" \
    RABBITMQ_LOG_BASE="$LOGS/rabbitmq" \
    RABBITMQ_PID_FILE="$RUN/rabbitmq.pidfile" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        start_svc rabbitmq "$rmq"
}

gunicorn_svc() {  # gunicorn_svc NAME PORT WORKERS APP [env...]
    local name=$1 port=$2 workers=$3 app=$4; shift 4
    start_svc "$name" env "$@" "$BIN/gunicorn" --name "sco-$name" \
        --bind "127.0.0.1:$port" --workers "$workers" --timeout 300 \
        --graceful-timeout 5 --no-control-socket --pythonpath "$LIB" \
        --error-logfile "$LOGS/$name.out" "$app"
}


# One chain per service, run in parallel: schema sync, then start the
# service. A failing sync leaves run/sync-NAME.failed.
synced() {  # synced NAME START_US
    log "$1 db synced ($(fmt_us $(( ${EPOCHREALTIME/./} - $2 )))s)"
}
chain_placement() {
    local t=${EPOCHREALTIME/./}
    "$BIN/placement-manage" --config-file "$ETC/placement/placement.conf" db sync \
        >> "$LOGS/sync-placement.log" 2>&1 || { : > "$RUN/sync-placement.failed"; return 1; }
    synced placement "$t"
    gunicorn_svc placement "$PLACEMENT_PORT" "${SCO_OS_API_WORKERS:-2}" \
        wsgi_placement:application OS_PLACEMENT_CONFIG_DIR="$ETC/placement"
}
chain_glance() {
    local t=${EPOCHREALTIME/./}
    "$BIN/glance-manage" --config-file "$ETC/glance/glance-api.conf" db_sync \
        >> "$LOGS/sync-glance.log" 2>&1 || { : > "$RUN/sync-glance.failed"; return 1; }
    synced glance "$t"
    gunicorn_svc glance "$GLANCE_PORT" 1 glance.wsgi.api:application \
        OS_GLANCE_CONFIG_DIR="$ETC/glance"
}
chain_neutron() {
    local t=${EPOCHREALTIME/./}
    "$BIN/neutron-db-manage" --config-file "$ETC/neutron/neutron.conf" upgrade heads \
        >> "$LOGS/sync-neutron.log" 2>&1 || { : > "$RUN/sync-neutron.failed"; return 1; }
    synced neutron "$t"
    gunicorn_svc neutron "$NEUTRON_PORT" 1 wsgi_neutron_api:application \
        OS_NEUTRON_CONFIG_DIR="$ETC/neutron" OS_NEUTRON_CONFIG_FILES=neutron.conf
}
chain_nova() {
    # api_db sync, map_cell0, create_cell cell1, db sync -- in one process.
    local t=${EPOCHREALTIME/./}
    "$PY" "$LIB/nova_db_setup.py" "$(db_url nova_cell0)" \
        --config-file "$ETC/nova/nova.conf" --config-file "$ETC/nova/nova-db.conf" \
        >> "$LOGS/sync-nova.log" 2>&1 || { : > "$RUN/sync-nova.failed"; return 1; }
    synced "nova api/cell0/cell1" "$t"
    # conductor and scheduler need RabbitMQ; nova-api only the DB.
    gunicorn_svc nova-api "$NOVA_PORT" "${SCO_OS_API_WORKERS:-2}" wsgi_nova_api:application \
        OS_NOVA_CONFIG_DIR="$ETC/nova" \
        "OS_NOVA_CONFIG_FILES=api-paste.ini;nova.conf;nova-db.conf;nova-api.conf"
    stackctl wait-port "$AMQP_PORT" --timeout "$TIMEOUT" --pid "$(svc_pid rabbitmq)" \
        >> "$LOGS/sync-nova.log" 2>&1 || { : > "$RUN/rabbitmq.failed"; return 1; }
    log "rabbitmq up"
    start_svc nova-conductor "$BIN/nova-conductor" --config-file "$ETC/nova/nova.conf" \
        --config-file "$ETC/nova/nova-db.conf" --log-file "$LOGS/nova-conductor.log"
    start_svc nova-scheduler "$BIN/nova-scheduler" --config-file "$ETC/nova/nova.conf" \
        --config-file "$ETC/nova/nova-db.conf" --log-file "$LOGS/nova-scheduler.log"
}

chain_keystone() {
    local t=${EPOCHREALTIME/./}
    "$PY" "$LIB/keystone_db_setup.py" "$ETC/keystone/keystone.conf" \
        "$DATA/keystone/fernet-keys" "$DATA/keystone/credential-keys" \
        "$ADMIN_PASS" "$KEYSTONE_URL/v3" >> "$LOGS/sync-keystone.log" 2>&1 \
        || { : > "$RUN/sync-keystone.failed"; return 1; }
    synced "keystone (keys, db_sync, bootstrap)" "$t"
    gunicorn_svc keystone "$KEYSTONE_PORT" 1 wsgi_keystone:application \
        OS_KEYSTONE_CONFIG_DIR="$ETC/keystone"
    stackctl wait-http "$KEYSTONE_URL/v3" --timeout "$TIMEOUT" --pid "$(svc_pid keystone)" \
        >> "$LOGS/sync-keystone.log" 2>&1 || { : > "$RUN/sync-keystone.failed"; return 1; }
    "$PY" "$LIB/keystone_setup.py" "$KEYSTONE_URL/v3" "$ADMIN_PASS" "$SERVICE_PASS" "$CAPACITY_ROLE" \
        "compute=$NOVA_URL" "placement=$PLACEMENT_URL" "image=$GLANCE_URL" \
        "network=$NEUTRON_URL" ${IRONIC_URL:+"baremetal=$IRONIC_URL"} >> "$LOGS/sync-keystone.log" 2>&1 \
        || { : > "$RUN/sync-keystone.failed"; return 1; }
    synced "keystone answering, service users + catalog" "$t"
}

chain_ironic() {
    # schema, then ironic (API + conductor), then enroll the nodes
    local t=${EPOCHREALTIME/./}
    "$BIN/ironic-dbsync" --config-file "$ETC/ironic/ironic.conf" upgrade \
        >> "$LOGS/sync-ironic.log" 2>&1 || { : > "$RUN/sync-ironic.failed"; return 1; }
    synced ironic "$t"
    start_svc ironic "$BIN/ironic" --config-file "$ETC/ironic/ironic.conf"
    # its root answers without a token (Keystone may not be up yet)
    stackctl wait-http "$IRONIC_URL/" --timeout "$TIMEOUT" --pid "$(svc_pid ironic)" \
        >> "$LOGS/sync-ironic.log" 2>&1 || { : > "$RUN/sync-ironic.failed"; return 1; }
    # Keystone mode: enrolling needs a token, so it waits for Keystone's chain
    [ "$KEYSTONE" = 1 ] || enroll_ironic "$t" || { : > "$RUN/sync-ironic.failed"; return 1; }
}

enroll_ironic() {  # enroll_ironic START_US
    stackctl ironic-enroll "$IRONIC_URL" --count "$IRONIC_NODES" --resource-class "$IRONIC_RC" \
        ${IRONIC_TRAITS:+--traits "$IRONIC_TRAITS"} --timeout "$TIMEOUT" --pid "$(svc_pid ironic)" \
        >> "$LOGS/sync-ironic.log" 2>&1 || return 1
    log "ironic answering, $IRONIC_NODES nodes available ($(fmt_us $(( ${EPOCHREALTIME/./} - $1 )))s)"
}

start_ironic_compute() {  # after nova-conductor is up
    local name="nova-compute-$IRONIC_HOST"
    start_svc "$name" "$BIN/nova-compute" --config-file "$ETC/nova/nova.conf" \
        --config-file "$ETC/nova/compute-$IRONIC_HOST.conf"
    stackctl wait-ironic-compute --placement "$PLACEMENT_URL" --host "$IRONIC_HOST" \
        --resource-class "$IRONIC_PRC" --count "$IRONIC_NODES" \
        ${IRONIC_TRAITS:+--traits "$IRONIC_TRAITS"} --db-port "$DB_PORT" --db-user "$DB_USER" \
        --db-password "$DB_PASS" --timeout "$TIMEOUT" --pid "$(svc_pid "$name")" \
        || fail "the ironic compute's $IRONIC_NODES providers did not appear" "$name" ironic
}

wait_http() {  # wait_http NAME URL [extra stackctl args]
    local name=$1 url=$2; shift 2
    stackctl wait-http "$url" --timeout "$TIMEOUT" --pid "$(svc_pid "$name")" "$@" \
        || fail "$name did not answer on $url within ${TIMEOUT}s" "$name"
}

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

write_clouds_yaml() {
    if [ "$KEYSTONE" = 1 ]; then
        cat > "$DIR/clouds.yaml" <<EOF
# Written by nova.sh up (Keystone mode). Endpoints come from the catalog.
clouds:
  sco-test:
    auth_type: password
    region_name: RegionOne
    auth:
      auth_url: $KEYSTONE_URL/v3
      username: admin
      password: $ADMIN_PASS
      project_name: admin
      user_domain_id: default
      project_domain_id: default
EOF
        return 0
    fi
    cat > "$DIR/clouds.yaml" <<EOF
# Written by nova.sh up. Use: OS_CLIENT_CONFIG_FILE=$DIR/clouds.yaml, cloud sco-test.
clouds:
  sco-test:
    auth_type: admin_token
    auth:
      endpoint: $NOVA_URL
      token: admin
    compute_endpoint_override: $NOVA_URL
    placement_endpoint_override: $PLACEMENT_URL
    image_endpoint_override: $GLANCE_URL
    network_endpoint_override: $NEUTRON_URL
EOF
    [ -z "$IRONIC_URL" ] || echo "    baremetal_endpoint_override: $IRONIC_URL" >> "$DIR/clouds.yaml"
    return 0
}

write_stack_env() {  # write_stack_env READY(0|1)
    local tmp="$DIR/stack.env.tmp" k
    {
        echo "# Written by nova.sh up; source it."
        for k in DIR VENV BASE NOVA_PORT PLACEMENT_PORT GLANCE_PORT NEUTRON_PORT \
                 DB_PORT DB_SOCKET DB_USER DB_PASS AMQP_PORT DIST_PORT EPMD_PORT \
                 NOVA_URL PLACEMENT_URL GLANCE_URL NEUTRON_URL TRANSPORT_URL \
                 KEYSTONE_URL; do
            printf 'export SCO_OS_%s=%q\n' "$k" "${!k}"
        done
        [ -z "$KEYSTONE_URL" ] || printf 'export SCO_OS_ADMIN_PASSWORD=%q\n' "$ADMIN_PASS"
        if [ -n "$IRONIC_URL" ]; then
            printf 'export SCO_OS_IRONIC_URL=%q\n' "$IRONIC_URL"
            printf 'export SCO_OS_IRONIC_HOST=%q\n' "$IRONIC_HOST"
            printf 'export SCO_OS_IRONIC_NODES=%q\n' "$IRONIC_NODES"
            printf 'export SCO_OS_IRONIC_RC=%q\n' "$IRONIC_RC"
            printf 'export SCO_OS_IRONIC_PLACEMENT_RC=%q\n' "$IRONIC_PRC"
        fi
        printf 'export SCO_OS_IMAGE_NAME=cirros-fake\n'
        printf 'export SCO_OS_IMAGE_ID=%q\n' "${IMAGE_ID:-}"
        printf 'export OS_CLIENT_CONFIG_FILE=%q\n' "$DIR/clouds.yaml"
        printf 'export OS_CLOUD=sco-test\n'
        printf 'export SCO_OS_READY=%s\n' "$1"
    } > "$tmp"
    mv "$tmp" "$DIR/stack.env"
}

load_stack_env() {
    set_layout "$1"
    [ -f "$DIR/stack.env" ] || die "$DIR/stack.env missing: run '$0 up $DIR' first"
    # shellcheck disable=SC1091
    . "$DIR/stack.env"
    [ "${SCO_OS_READY:-0}" = 1 ] || die "the stack in $DIR did not finish 'up'"
    local k
    for k in VENV BASE NOVA_PORT PLACEMENT_PORT DB_PORT DB_USER DB_PASS \
             NOVA_URL PLACEMENT_URL; do
        eval "$k=\$SCO_OS_$k"
    done
    PY=$VENV/bin/python BIN=$VENV/bin
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
