"""gunicorn entry point for nova-api (osapi_compute).

nova's WSGI init parses sys.argv with oslo.config, so gunicorn's own
arguments would make it exit; hide them. Config files come from
OS_NOVA_CONFIG_DIR / OS_NOVA_CONFIG_FILES (api-paste.ini first).
"""
import sys

sys.argv = sys.argv[:1]

from nova.wsgi.osapi_compute import application  # noqa: E402,F401
