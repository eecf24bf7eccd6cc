"""Keystone mode of nova.sh: after `keystone-manage bootstrap`, create the
service project, one service user per API (roles admin + service on project
`service`), the catalog (compute, placement, image, network) and one more role
(nova.sh's capacity-reading role, which its policy files name). Stdlib only;
idempotent enough for a fresh stack. Prints nothing on stdout.

  keystone_setup.py KEYSTONE_URL ADMIN_PASSWORD SERVICE_PASSWORD EXTRA_ROLE \
      compute=URL placement=URL image=URL network=URL
"""
import json
import sys
import urllib.error
import urllib.request

USERS = ('nova', 'placement', 'glance', 'neutron', 'ironic')


def main():
    base, admin_pw, svc_pw = sys.argv[1].rstrip('/'), sys.argv[2], sys.argv[3]
    extra_role = sys.argv[4]
    endpoints = dict(a.split('=', 1) for a in sys.argv[5:])

    def call(method, path, body=None, token=None):
        req = urllib.request.Request(
            base + path, method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={'Content-Type': 'application/json',
                     **({'X-Auth-Token': token} if token else {})})
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.headers, (json.loads(raw) if raw else None)

    hdrs, _ = call('POST', '/auth/tokens', {'auth': {
        'identity': {'methods': ['password'], 'password': {'user': {
            'name': 'admin', 'domain': {'id': 'default'}, 'password': admin_pw}}},
        'scope': {'project': {'name': 'admin', 'domain': {'id': 'default'}}}}})
    tok = hdrs['X-Subject-Token']
    call('POST', '/roles', {'role': {'name': extra_role}}, tok)
    roles = {r['name']: r['id'] for r in call('GET', '/roles', token=tok)[1]['roles']}
    _, p = call('POST', '/projects', {'project': {
        'name': 'service', 'domain_id': 'default'}}, tok)
    svc = p['project']['id']
    for name in USERS:
        _, u = call('POST', '/users', {'user': {
            'name': name, 'domain_id': 'default', 'password': svc_pw,
            'default_project_id': svc}}, tok)
        for role in ('admin', 'service'):
            call('PUT', '/projects/%s/users/%s/roles/%s'
                 % (svc, u['user']['id'], roles[role]), token=tok)
    for stype, url in endpoints.items():
        _, s = call('POST', '/services', {'service': {
            'type': stype, 'name': stype, 'enabled': True}}, tok)
        call('POST', '/endpoints', {'endpoint': {
            'service_id': s['service']['id'], 'interface': 'public',
            'region_id': 'RegionOne', 'url': url, 'enabled': True}}, tok)


if __name__ == '__main__':
    try:
        main()
    except urllib.error.HTTPError as e:
        sys.exit('keystone_setup: HTTP %s %s: %s' % (e.code, e.url, e.read()[:300]))
