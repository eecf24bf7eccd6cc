"""gunicorn entry point for Keystone: keystone.server.configure() calls
CONF(project='keystone') with args=None, i.e. it parses sys.argv, which under
gunicorn is gunicorn's own; hide it (same trick as nova.sh's wsgi_nova_api).
Config from OS_KEYSTONE_CONFIG_DIR / OS_KEYSTONE_CONFIG_FILES."""
import sys

sys.argv = sys.argv[:1]

from keystone.wsgi.api import application  # noqa: E402,F401
