# shellcheck shell=bash
# Sourced by nova.sh: starting the services. MariaDB and RabbitMQ first; then
# one chain per service, run in parallel (schema sync, then the service); the
# Ironic compute; and the wait for an API to answer.

# ----------------------------------------------------------- services -----
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
