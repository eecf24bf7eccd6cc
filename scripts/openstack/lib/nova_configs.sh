# shellcheck shell=bash
# Sourced by nova.sh: the services' configuration files under etc/, written
# by `up` (write_configs), in noauth mode (sco_noauth) or, with
# SCO_OS_KEYSTONE=1, with Keystone's authtoken, service users and policies.

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
