# shellcheck shell=bash
# Sourced by nova.sh: where a stack lives. Its folder and subfolders, its
# ports and URLs (from SCO_OS_BASE_PORT), Ironic mode's node settings, and the
# files `up` writes for its users and for later commands (clouds.yaml,
# stack.env, which add-compute reads back).

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

# ------------------------------------------------ stack.env, clouds.yaml ----
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
