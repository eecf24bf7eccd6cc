"""gunicorn entry point for the stack's Placement.

Placement's own noauth2 gives the admin role only to the token `admin`. The
other services of this stack (see sco_noauth.py) also accept `admin#ANYTHING`
as admin, so a test can use one token it can look for in logs and state;
this makes Placement agree.
"""
from placement.wsgi.api import application as _placement


def application(environ, start_response):
    if environ.get('HTTP_X_AUTH_TOKEN', '').startswith('admin#'):
        environ['HTTP_X_AUTH_TOKEN'] = 'admin'
    return _placement(environ, start_response)
