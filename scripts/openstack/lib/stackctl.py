"""Small helpers for nova.sh (readiness probes, image upload).

Runs with the stack's venv python; uses the standard library only, plus
PyMySQL for the host-mapping check. Every wait exits with
  0 ready, 1 timed out, 2 the watched process died
and says why on stderr.
"""
import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def _log(msg):
    print('[stackctl] %s' % msg, file=sys.stderr, flush=True)


def _alive(pid):
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as dead.
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


_TOKEN = {}


def admin_token():
    """'admin' for the noauth stack; in Keystone mode (SCO_OS_KEYSTONE_URL
    set) a real admin token, fetched once per process."""
    url = os.environ.get('SCO_OS_KEYSTONE_URL')
    if not url:
        return 'admin'
    if 'tok' not in _TOKEN:
        body = {'auth': {'identity': {'methods': ['password'], 'password': {
            'user': {'name': 'admin', 'domain': {'id': 'default'},
                     'password': os.environ['SCO_OS_ADMIN_PASSWORD']}}},
            'scope': {'project': {'name': 'admin',
                                  'domain': {'id': 'default'}}}}}
        req = urllib.request.Request(
            url.rstrip('/') + '/v3/auth/tokens', data=json.dumps(body).encode(),
            headers={'Content-Type': 'application/json'}, method='POST')
        with urllib.request.urlopen(req, timeout=10) as resp:
            _TOKEN['tok'] = resp.headers['X-Subject-Token']
    return _TOKEN['tok']


def http(method, url, token=None, headers=None, body=None, timeout=10):
    hdrs = {'X-Auth-Token': token or admin_token(), 'Accept': 'application/json'}
    hdrs.update(headers or {})
    data = None
    if body is not None:
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
        else:
            data = json.dumps(body).encode()
            hdrs.setdefault('Content-Type', 'application/json')
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = raw.decode(errors='replace')
    return status, doc


def _poll(check, timeout, pids, what, interval=0.25):
    """Call check() until it returns a true value; returns the exit code."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        for pid in pids:
            if not _alive(pid):
                _log('%s: process %d died' % (what, pid))
                return 2
        try:
            ok, last = check()
        except Exception as e:  # connection refused, reset, timeout, ...
            ok, last = False, '%s: %s' % (type(e).__name__, e)
        if ok:
            return 0
        if time.monotonic() > deadline:
            _log('%s: not ready after %ss (last: %s)' % (what, timeout, last))
            return 1
        time.sleep(interval)


def cmd_wait_http(a):
    hdrs = dict(h.split(':', 1) for h in a.header)

    def check():
        status, doc = http('GET', a.url, token=a.token, headers=hdrs)
        return status == a.status, 'HTTP %s %s' % (status, str(doc)[:200])
    return _poll(check, a.timeout, a.pid, a.url)


def cmd_wait_nova_services(a):
    want = set(a.binary)

    def check():
        status, doc = http('GET', a.url.rstrip('/') + '/os-services',
                           headers={'OpenStack-API-Version': 'compute 2.53'})
        if status != 200:
            return False, 'HTTP %s %s' % (status, str(doc)[:200])
        up = {s['binary'] for s in doc['services']
              if s['state'] == 'up' and s['status'] == 'enabled'}
        return want <= up, 'up: %s' % sorted(up)
    return _poll(check, a.timeout, a.pid, 'nova services %s' % sorted(want),
                 interval=0.5)


def cmd_create_image(a):
    base = a.url.rstrip('/')
    status, doc = http('GET', base + '/v2/images?name=' + a.name)
    if status == 200 and doc['images']:
        print(doc['images'][0]['id'])
        return 0
    status, doc = http('POST', base + '/v2/images', body={
        'name': a.name, 'disk_format': 'raw', 'container_format': 'bare',
        'visibility': 'public', 'min_disk': 0, 'min_ram': 0})
    if status != 201:
        _log('image create: HTTP %s %s' % (status, doc))
        return 1
    image_id = doc['id']
    status, doc = http('PUT', '%s/v2/images/%s/file' % (base, image_id),
                       headers={'Content-Type': 'application/octet-stream'},
                       body=a.data.encode())
    if status != 204:
        _log('image upload: HTTP %s %s' % (status, doc))
        return 1

    def check():
        st, d = http('GET', '%s/v2/images/%s' % (base, image_id))
        return st == 200 and d.get('status') == 'active', d
    rc = _poll(check, 30, [], 'image %s active' % a.name)
    if rc == 0:
        print(image_id)
    return rc


def cmd_wait_compute(a):
    """Resource provider (with the configured spot inventory/traits) exists
    in Placement and the host is mapped to a cell in the API DB."""
    base = a.placement.rstrip('/')
    pv = {'OpenStack-API-Version': 'placement 1.39'}
    want_traits = set(a.trait)
    state = {}

    def rp_ready():
        st, d = http('GET', '%s/resource_providers?name=%s' % (base, a.host),
                     headers=pv)
        if st != 200 or not d['resource_providers']:
            return False, 'no resource provider named %s yet' % a.host
        uuid = d['resource_providers'][0]['uuid']
        st, inv = http('GET', '%s/resource_providers/%s/inventories'
                       % (base, uuid), headers=pv)
        invs = inv['inventories'] if st == 200 else {}
        if 'VCPU' not in invs:
            return False, 'no VCPU inventory yet'
        if a.spot > 0:
            slot = invs.get('CUSTOM_SPOT_SLOT', {}).get('total')
            if slot != a.spot:
                return False, 'CUSTOM_SPOT_SLOT total=%s' % slot
        st, tr = http('GET', '%s/resource_providers/%s/traits'
                      % (base, uuid), headers=pv)
        have = set(tr['traits']) if st == 200 else set()
        if not want_traits <= have:
            return False, 'traits %s' % sorted(have)
        state['uuid'] = uuid
        return True, uuid

    rc = _poll(rp_ready, a.timeout, a.pid, 'resource provider %s' % a.host)
    if rc:
        return rc

    rc = _wait_mapped(a)
    if rc == 0:
        print(state['uuid'])
    return rc


IRONIC_MV = {'X-OpenStack-Ironic-API-Version': '1.80'}


def cmd_ironic_enroll(a):
    """Ironic (noauth): create --count fake-hardware nodes bm-0.. with the
    resource class and traits, then manage -> provide -> power on, and wait
    until all are available and powered on. Prints the node uuids.
    Power on matters: a fake node keeps its power state through deploy, and
    nova's power-state sync would stop a server whose node is off."""
    base = a.url.rstrip('/')
    traits = [t for t in (a.traits or '').split(',') if t]
    uuids = []
    for i in range(a.count):
        st, d = http('POST', base + '/v1/nodes', headers=IRONIC_MV, body={
            'name': '%s%d' % (a.prefix, i), 'driver': 'fake-hardware',
            'resource_class': a.resource_class,
            'properties': {'cpus': a.cpus, 'memory_mb': a.memory_mb,
                           'local_gb': a.local_gb, 'cpu_arch': 'x86_64'}})
        if st != 201:
            _log('create node: HTTP %s %s' % (st, d))
            return 1
        uuids.append(d['uuid'])
        if traits:
            st, d = http('PUT', '%s/v1/nodes/%s/traits' % (base, d['uuid']),
                         headers=IRONIC_MV, body={'traits': traits})
            if st != 204:
                _log('set traits: HTTP %s %s' % (st, d))
                return 1

    def move(target, want, path='provision'):
        for u in uuids:
            st, d = http('PUT', '%s/v1/nodes/%s/states/%s' % (base, u, path),
                         headers=IRONIC_MV, body={'target': target})
            if st != 202:
                _log('%s %s: HTTP %s %s' % (target, u, st, d))
                return 1

        def check():
            st, d = http('GET', base + '/v1/nodes?fields=uuid,provision_state,'
                         'power_state,last_error', headers=IRONIC_MV)
            got = {n['uuid']: n for n in d['nodes']} if st == 200 else {}
            bad = [(u, got.get(u)) for u in uuids
                   if (got.get(u) or {}).get(want[0]) != want[1]]
            return not bad, bad[:2]
        return _poll(check, a.timeout, a.pid, 'nodes %s' % target, interval=0.1)
    for target, want, path in (('manage', ('provision_state', 'manageable'), 'provision'),
                               ('provide', ('provision_state', 'available'), 'provision'),
                               ('power on', ('power_state', 'power on'), 'power')):
        rc = move(target, want, path)
        if rc:
            return rc
    print('\n'.join(uuids))
    return 0


def cmd_wait_ironic_compute(a):
    """Every Ironic node is a resource provider (named by node uuid) with
    inventory RESOURCE_CLASS total 1 reserved 0 (and the traits), and the
    ironic compute's host is mapped to a cell."""
    base = a.placement.rstrip('/')
    pv = {'OpenStack-API-Version': 'placement 1.39'}
    want_traits = set(t for t in (a.traits or '').split(',') if t)

    def rps_ready():
        st, d = http('GET', '%s/resource_providers?resources=%s:1'
                     % (base, a.resource_class), headers=pv)
        if st != 200:
            return False, 'HTTP %s' % st
        ok = 0
        for rp in d['resource_providers']:
            st, tr = http('GET', '%s/resource_providers/%s/traits'
                          % (base, rp['uuid']), headers=pv)
            if st == 200 and want_traits <= set(tr['traits']):
                ok += 1
        return ok >= a.count, '%d of %d providers with free %s' % (
            ok, a.count, a.resource_class)

    rc = _poll(rps_ready, a.timeout, a.pid, 'ironic resource providers',
               interval=0.5)
    if rc:
        return rc

    return _wait_mapped(a)


def _wait_mapped(a):
    """Until the compute host a.host is mapped to a cell (nova_api's host_mappings)."""
    import pymysql

    def mapped():
        conn = pymysql.connect(host='127.0.0.1', port=a.db_port,
                               user=a.db_user, password=a.db_password,
                               database='nova_api', connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute('SELECT c.name FROM host_mappings h JOIN '
                            'cell_mappings c ON h.cell_id = c.id '
                            'WHERE h.host = %s', (a.host,))
                row = cur.fetchone()
        finally:
            conn.close()
        return bool(row), row and row[0]
    return _poll(mapped, a.timeout, a.pid, 'host mapping for %s' % a.host,
                 interval=0.5)


def cmd_wait_port(a):
    import socket

    def check():
        with socket.create_connection(('127.0.0.1', a.port), timeout=2):
            return True, 'open'
    return _poll(check, a.timeout, a.pid, 'port %d' % a.port, interval=0.2)


def cmd_mysql_init(a):
    """Wait for the private MariaDB (root over its socket), then create the
    databases and a TCP user for the services."""
    import pymysql

    conns = []

    def check():
        conns.append(pymysql.connect(unix_socket=a.socket, user='root',
                                     connect_timeout=2, autocommit=True))
        return True, 'connected'
    rc = _poll(check, a.timeout, a.pid, 'mariadb socket %s' % a.socket)
    if rc:
        return rc
    conn = conns[-1]
    with conn.cursor() as cur:
        for db in a.database:
            cur.execute('CREATE DATABASE IF NOT EXISTS `%s` '
                        'CHARACTER SET utf8mb4' % db)
        for host in ('127.0.0.1', 'localhost'):
            cur.execute("CREATE USER IF NOT EXISTS %s@%s IDENTIFIED BY %s",
                        (a.user, host, a.password))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO %s@%s",
                        (a.user, host))
    conn.close()
    return 0


def main():
    p = argparse.ArgumentParser(prog='stackctl')
    sub = p.add_subparsers(dest='cmd', required=True)

    w = sub.add_parser('wait-http')
    w.add_argument('url')
    w.add_argument('--token', default=None)
    w.add_argument('--header', action='append', default=[])
    w.add_argument('--status', type=int, default=200)
    w.add_argument('--timeout', type=float, default=60)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_wait_http)

    w = sub.add_parser('wait-nova-services')
    w.add_argument('url', help='compute endpoint, .../v2.1')
    w.add_argument('--binary', action='append', required=True)
    w.add_argument('--timeout', type=float, default=60)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_wait_nova_services)

    w = sub.add_parser('create-image')
    w.add_argument('url', help='image endpoint')
    w.add_argument('name')
    w.add_argument('--data', default='sco fake image\n')
    w.set_defaults(fn=cmd_create_image)

    w = sub.add_parser('wait-compute')
    w.add_argument('--placement', required=True)
    w.add_argument('--host', required=True)
    w.add_argument('--spot', type=int, default=0)
    w.add_argument('--trait', action='append', default=[])
    w.add_argument('--db-port', type=int, required=True)
    w.add_argument('--db-user', required=True)
    w.add_argument('--db-password', required=True)
    w.add_argument('--timeout', type=float, default=90)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_wait_compute)

    w = sub.add_parser('ironic-enroll')
    w.add_argument('url', help='Ironic endpoint')
    w.add_argument('--count', type=int, required=True)
    w.add_argument('--resource-class', required=True)
    w.add_argument('--traits', default='', help='comma-separated CUSTOM_*')
    w.add_argument('--prefix', default='bm-')
    w.add_argument('--cpus', type=int, default=8)
    w.add_argument('--memory-mb', type=int, default=32768)
    w.add_argument('--local-gb', type=int, default=100)
    w.add_argument('--timeout', type=float, default=60)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_ironic_enroll)

    w = sub.add_parser('wait-ironic-compute')
    w.add_argument('--placement', required=True)
    w.add_argument('--host', required=True)
    w.add_argument('--resource-class', required=True, help='Placement name, CUSTOM_*')
    w.add_argument('--count', type=int, required=True)
    w.add_argument('--traits', default='')
    w.add_argument('--db-port', type=int, required=True)
    w.add_argument('--db-user', required=True)
    w.add_argument('--db-password', required=True)
    w.add_argument('--timeout', type=float, default=90)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_wait_ironic_compute)

    w = sub.add_parser('wait-port')
    w.add_argument('port', type=int)
    w.add_argument('--timeout', type=float, default=60)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_wait_port)

    w = sub.add_parser('mysql-init')
    w.add_argument('--socket', required=True)
    w.add_argument('--user', required=True)
    w.add_argument('--password', required=True)
    w.add_argument('--database', action='append', default=[])
    w.add_argument('--timeout', type=float, default=60)
    w.add_argument('--pid', type=int, action='append', default=[])
    w.set_defaults(fn=cmd_mysql_init)

    a = p.parse_args()
    sys.exit(a.fn(a))


if __name__ == '__main__':
    main()
