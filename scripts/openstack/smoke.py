#!/usr/bin/env python3
"""End-to-end smoke test of the nova.sh stack through openstacksdk.

    smoke.py DIR            # stack already up, computes c1 and c2 (4 spot slots each)
    smoke.py --manage DIR   # also runs: nova.sh up DIR, add-compute c1 4 / c2 4
                            # (in parallel), and nova.sh down DIR at the end

Run it with the stack's venv python (it needs openstacksdk==4.22.0), e.g.
    "$(scripts/openstack/install.sh)/bin/python" scripts/openstack/smoke.py --manage /tmp/os

Checks: flavor spot.small (resources:CUSTOM_SPOT_SLOT=1,
trait:CUSTOM_SPOT_CAPABLE=required); aggregates/AZs hall-a={c1}, hall-b={c2};
a min=max=4 batch in hall-a goes ACTIVE on c1; a 5th server in hall-a goes
ERROR (NoValidHost); GET /servers/detail?tags=... finds the batch; after
deleting everything, Placement usages are back to 0. Prints timings and
the stack's memory (PSS). Exit 0 on success.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NOVA_SH = os.path.join(HERE, 'nova.sh')
MICROVERSION = '2.104'   # nova 34 max; accepts everything used below
PLACEMENT_MV = '1.39'
TIMINGS = []


def step(name, t0):
    dt = time.monotonic() - t0
    TIMINGS.append((name, dt))
    print('[smoke] %-34s %6.2fs' % (name, dt), flush=True)


def check(cond, msg):
    if not cond:
        raise SystemExit('[smoke] FAILED: %s' % msg)


def sh(*args):
    t0 = time.monotonic()
    subprocess.run([NOVA_SH] + list(args), check=True)
    return time.monotonic() - t0


def wait_for(fn, timeout, what, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        res = fn()
        if res:
            return res
        if time.monotonic() > deadline:
            raise SystemExit('[smoke] FAILED: timed out waiting for %s' % what)
        time.sleep(interval)


def servers_by_tag(conn, tag):
    r = conn.compute.get('/servers/detail?tags=%s' % tag,
                         microversion=MICROVERSION)
    check(r.status_code == 200, 'GET /servers/detail?tags: HTTP %s %s'
          % (r.status_code, r.text[:300]))
    return r.json()['servers']


def boot(conn, name, image_id, flavor_id, count, az, tags, meta):
    body = {'server': {
        'name': name, 'imageRef': image_id, 'flavorRef': flavor_id,
        'min_count': count, 'max_count': count,
        'return_reservation_id': True, 'networks': 'none',
        'availability_zone': az, 'tags': tags, 'metadata': meta}}
    r = conn.compute.post('/servers', json=body, microversion=MICROVERSION)
    check(r.status_code == 202, 'POST /servers: HTTP %s %s'
          % (r.status_code, r.text[:500]))
    return r.json()['reservation_id']


def by_reservation(conn, rid):
    r = conn.compute.get('/servers/detail?reservation_id=%s' % rid,
                         microversion=MICROVERSION)
    check(r.status_code == 200, 'list by reservation: HTTP %s' % r.status_code)
    return r.json()['servers']


def usages(conn, rp_uuid):
    r = conn.placement.get('/resource_providers/%s/usages' % rp_uuid,
                           microversion=PLACEMENT_MV)
    check(r.status_code == 200, 'placement usages: HTTP %s' % r.status_code)
    return r.json()['usages']


def rp_uuid(conn, name):
    r = conn.placement.get('/resource_providers?name=%s' % name,
                           microversion=PLACEMENT_MV)
    rps = r.json()['resource_providers']
    check(len(rps) == 1, 'resource provider %s not found' % name)
    return rps[0]['uuid']


def stack_pss_mb(stack_dir):
    """PSS of every process in the sessions recorded under DIR/run."""
    run = os.path.join(stack_dir, 'run')
    sids = {}
    for f in os.listdir(run):
        if f.endswith('.pid'):
            with open(os.path.join(run, f)) as fh:
                sids[int(fh.read().split()[0])] = f[:-4]
    per = {}
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % p) as fh:
                sid = int(fh.read().rsplit(')', 1)[1].split()[3])
            if sid not in sids:
                continue
            with open('/proc/%s/smaps_rollup' % p) as fh:
                pss = next(int(line.split()[1]) for line in fh
                           if line.startswith('Pss:'))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        per[sids[sid]] = per.get(sids[sid], 0) + pss / 1024.0
    return per


def run(stack_dir):
    os.environ['OS_CLIENT_CONFIG_FILE'] = os.path.join(stack_dir, 'clouds.yaml')
    import openstack
    conn = openstack.connect(cloud='sco-test')

    t0 = time.monotonic()
    image = conn.image.find_image('cirros-fake')
    check(image is not None, 'image cirros-fake missing')
    hyps = {h.name for h in conn.compute.hypervisors()}
    check({'c1', 'c2'} <= hyps, 'hypervisors c1, c2 expected, got %s' % hyps)

    flavor = conn.compute.find_flavor('spot.small')
    if flavor is None:
        flavor = conn.compute.create_flavor(name='spot.small', vcpus=1,
                                            ram=512, disk=1)
        conn.compute.create_flavor_extra_specs(flavor, {
            'resources:CUSTOM_SPOT_SLOT': '1',
            'trait:CUSTOM_SPOT_CAPABLE': 'required'})
    for name, host in (('hall-a', 'c1'), ('hall-b', 'c2')):
        agg = next((a for a in conn.compute.aggregates() if a.name == name),
                   None)
        if agg is None:
            agg = conn.compute.create_aggregate(name=name,
                                                availability_zone=name)
        if host not in (agg.hosts or []):
            conn.compute.add_host_to_aggregate(agg, host)
    step('flavor + aggregates', t0)

    # The batch: 4 x spot.small in hall-a fill c1's 4 spot slots.
    t0 = time.monotonic()
    rid = boot(conn, 'smoke-a', image.id, flavor.id, 4, 'hall-a',
               ['sco', 'sco-req-x'], {'sco-partition': 'p1'})
    post_dt = time.monotonic() - t0

    def batch_done():
        srv = by_reservation(conn, rid)
        if len(srv) == 4 and all(s['status'] in ('ACTIVE', 'ERROR')
                                 for s in srv):
            return srv
        return None
    srv = wait_for(batch_done, 120, 'batch of 4')
    step('boot 4 (POST %.2fs) -> all final' % post_dt, t0)
    bad = [(s['name'], s['status'], s.get('fault')) for s in srv
           if s['status'] != 'ACTIVE']
    check(not bad, 'batch servers not ACTIVE: %s' % bad)
    hosts = {s['OS-EXT-SRV-ATTR:host'] for s in srv}
    check(hosts == {'c1'}, 'batch landed on %s, expected c1' % hosts)
    check(all(s['OS-EXT-AZ:availability_zone'] == 'hall-a' for s in srv),
          'batch AZ not hall-a')
    check(all(s['metadata'].get('sco-partition') == 'p1' for s in srv),
          'metadata missing')
    c1 = rp_uuid(conn, 'c1')
    c2 = rp_uuid(conn, 'c2')
    u = usages(conn, c1)
    check(u.get('CUSTOM_SPOT_SLOT') == 4 and u.get('VCPU') == 4
          and u.get('MEMORY_MB') == 2048, 'c1 usages after batch: %s' % u)

    # A 5th spot server in hall-a: no slot left on c1 -> NoValidHost.
    t0 = time.monotonic()
    rid5 = boot(conn, 'smoke-5th', image.id, flavor.id, 1, 'hall-a',
                ['sco', 'sco-req-y'], {'sco-partition': 'p1'})

    def fifth_done():
        s = by_reservation(conn, rid5)
        return s if s and s[0]['status'] in ('ACTIVE', 'ERROR') else None
    s5 = wait_for(fifth_done, 60, '5th server')[0]
    step('5th server -> ERROR', t0)
    check(s5['status'] == 'ERROR', '5th server is %s, expected ERROR'
          % s5['status'])
    fault = (s5.get('fault') or {}).get('message', '')
    check('No valid host' in fault, 'unexpected fault: %r' % fault)

    t0 = time.monotonic()
    tagged = servers_by_tag(conn, 'sco-req-x')
    check(sorted(s['id'] for s in tagged) == sorted(s['id'] for s in srv),
          'tags=sco-req-x returned %d servers' % len(tagged))
    check(len(servers_by_tag(conn, 'sco')) == 5, 'tags=sco != 5 servers')
    check(all('sco-req-x' in s['tags'] for s in tagged), 'tags not shown')
    step('list by tags', t0)

    mem = stack_pss_mb(stack_dir)

    t0 = time.monotonic()
    all_ids = [s['id'] for s in srv] + [s5['id']]
    for sid in all_ids:
        conn.compute.delete_server(sid)

    def gone():
        left = [s for s in servers_by_tag(conn, 'sco')]
        return not left
    wait_for(gone, 120, 'servers deleted')
    step('delete 5 -> gone', t0)

    t0 = time.monotonic()

    def released():
        return all(not any(usages(conn, rp).values()) for rp in (c1, c2))
    wait_for(released, 30, 'placement usages back to 0')
    step('placement usages back to 0', t0)
    return mem


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('dir')
    ap.add_argument('--manage', action='store_true',
                    help='run nova.sh up/add-compute before and down after')
    a = ap.parse_args()
    stack_dir = os.path.abspath(a.dir)
    ok = False
    try:
        if a.manage:
            t0 = time.monotonic()
            sh('up', stack_dir)
            step('nova.sh up', t0)
            t0 = time.monotonic()
            procs = [subprocess.Popen([NOVA_SH, 'add-compute', stack_dir, h, '4'])
                     for h in ('c1', 'c2')]
            check(all(p.wait() == 0 for p in procs), 'add-compute failed')
            step('add-compute c1+c2 (parallel)', t0)
        mem = run(stack_dir)
        ok = True
    finally:
        if a.manage:
            t0 = time.monotonic()
            sh('down', stack_dir)
            step('nova.sh down', t0)
    print('[smoke] memory (PSS, MB) with 2 computes, 5 servers:')
    for name, mb in sorted(mem.items(), key=lambda kv: -kv[1]):
        print('[smoke]   %-22s %7.1f' % (name, mb))
    print('[smoke]   %-22s %7.1f' % ('TOTAL', sum(mem.values())))
    print('[smoke] OK' if ok else '[smoke] FAILED')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
