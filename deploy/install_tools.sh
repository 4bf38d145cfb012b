#!/usr/bin/env bash
# Installs what `make deploy-check` needs from Debian when it is missing: promtool + prometheus
# (to evaluate every PromQL expression against a live tritonserver) and, when no kubectl is on PATH,
# kubernetes-client (its `kubectl kustomize` renders the overlays); and chromium, the headless browser the
# gateway's page tests drive (/docs, /redoc: tests/test_docs_offline.py); redis-server and haproxy, the shared
# state and the load balancer of `make cluster` (docs/cluster.md). Idempotent: exits at once when present.
set -euo pipefail
want=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || want+=(prometheus)
command -v kubectl >/dev/null || want+=(kubernetes-client)
command -v chromium >/dev/null || want+=(chromium)
command -v redis-server >/dev/null || want+=(redis-server)
command -v haproxy >/dev/null || want+=(haproxy)
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  SUDO=sudo; command -v sudo >/dev/null || { echo "deploy tools: need root to apt-get install ${want[*]}" >&2; exit 1; }
else
  SUDO=
fi
echo "deploy tools: apt-get install ${want[*]}"
$SUDO apt-get update -qq
# The package's service is not wanted here (deploy-check starts its own Prometheus on free ports).
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
