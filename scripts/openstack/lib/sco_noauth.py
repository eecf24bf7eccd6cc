"""Keystone-less auth for the OpenStack test stack (paste filter).

Replaces keystonemiddleware's ``authtoken`` in the nova, glance and neutron
paste pipelines. It trusts the X-Auth-Token header and turns it into the
headers authtoken would have set, so the services' own context middleware
(NovaKeystoneContext, glance ContextMiddleware, NeutronKeystoneContext) and
their default policies work unchanged:

    X-Auth-Token: admin            -> user admin, project admin,
                                      roles admin,member,reader
    X-Auth-Token: admin#ANYTHING   -> the same as admin (a test can use a token
                                      it can look for in logs and state)
    X-Auth-Token: USER[:PROJECT]   -> that user/project, roles member,reader
    X-Auth-Token: invalid...       -> 401, as Keystone answers a bad token
    no token                       -> 401

Test use only: there is no authentication at all.
"""

_STRIP = ('HTTP_X_IDENTITY_STATUS', 'HTTP_X_SERVICE_IDENTITY_STATUS',
          'HTTP_X_USER_ID', 'HTTP_X_USER_NAME', 'HTTP_X_USER',
          'HTTP_X_PROJECT_ID', 'HTTP_X_PROJECT_NAME', 'HTTP_X_TENANT_ID',
          'HTTP_X_TENANT_NAME', 'HTTP_X_TENANT', 'HTTP_X_ROLES', 'HTTP_X_ROLE',
          'HTTP_X_SERVICE_ROLES', 'HTTP_X_USER_DOMAIN_ID',
          'HTTP_X_PROJECT_DOMAIN_ID', 'HTTP_X_SYSTEM_SCOPE',
          'HTTP_X_IS_ADMIN_PROJECT')


class NoAuth(object):
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        token = environ.get('HTTP_X_AUTH_TOKEN', '').strip()
        if not token or token.startswith('invalid'):
            body = b'{"error": "missing X-Auth-Token"}'
            start_response('401 Unauthorized', [
                ('Content-Type', 'application/json'),
                ('Content-Length', str(len(body)))])
            return [body]
        for key in _STRIP:
            environ.pop(key, None)
        user, _, project = token.partition(':')
        user = user.split('#', 1)[0]
        project = project or user
        roles = 'admin,member,reader' if user == 'admin' else 'member,reader'
        environ.update({
            'HTTP_X_IDENTITY_STATUS': 'Confirmed',
            'HTTP_X_USER_ID': user,
            'HTTP_X_USER_NAME': user,
            'HTTP_X_USER_DOMAIN_ID': 'default',
            'HTTP_X_PROJECT_ID': project,
            'HTTP_X_TENANT_ID': project,
            'HTTP_X_PROJECT_NAME': project,
            'HTTP_X_PROJECT_DOMAIN_ID': 'default',
            'HTTP_X_ROLES': roles,
            'HTTP_X_IS_ADMIN_PROJECT': 'True' if user == 'admin' else 'False',
        })
        return self.app(environ, start_response)


def filter_factory(global_conf, **local_conf):
    return NoAuth
