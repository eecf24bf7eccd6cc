#!/usr/bin/env bash
# Creates the virtual environment named by $1 on a fresh Debian machine with
# Python 3.11: installs the venv module from Debian when it is missing, then
# the project with its development extras.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}

if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    echo "sco needs Python 3.11 or newer as '$python'" >&2
    exit 2
fi
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "installing the Python venv module from Debian" >&2
    apt-get update -q
    apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends python3-venv
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -e ".[dev]"
# The test harnesses, a package of their own so that the product never ships them.
"$venv/bin/python" -m pip install -q --no-deps -e tests/harness
