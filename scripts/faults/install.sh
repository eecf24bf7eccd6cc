#!/usr/bin/env bash
# What the fault matrix (bench/faults.py and its short tier in the tests) needs
# besides the services the other tiers install: libfaketime, to run one replica
# with its clock 2 s ahead of the others.
set -euo pipefail
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends faketime >&2
fi
ls /usr/lib/*/faketime/libfaketime.so.1 | head -1
