"""gunicorn entry point for neutron-api.

* neutron parses sys.argv with oslo.config: hide gunicorn's arguments.
* A cold worker's first GET /v2.0/ports fails with "Port has no
  'port_forwardings'" unless all ORM mappers (incl. the port_forwarding
  service plugin's relationship) are configured up front.
Config files come from OS_NEUTRON_CONFIG_DIR / OS_NEUTRON_CONFIG_FILES.
"""
import sys

sys.argv = sys.argv[:1]

from neutron.wsgi.api import application  # noqa: E402,F401
from sqlalchemy import orm  # noqa: E402

orm.configure_mappers()
