#!/usr/bin/env bash
# One-time, idempotent set-up for `make setup` (everything) and `make run` (`--run`: only
# what running the agent needs): Debian packages, uv, the virtualenv with every
# workspace package installed editable, and the generated gRPC stubs. Each step checks
# first and is skipped when already done; each step that did something says how long it
# took. Never touches system daemons: it only installs packages, under a policy-rc.d
# that forbids starting any (docker.io's post-install script would otherwise start the
# system dockerd through its init script; the compose tests start a private one,
# klet.testbed.Dockerd).
set -euo pipefail
cd "$(dirname "$0")/.."

# `klet up`: the runtime, its CNI plugins and network tools, the registry and busybox of
# the example pods' images, Redis.
RUN_PACKAGES=(containerd runc containernetworking-plugins busybox-static docker-registry
              redis-server iproute2 iptables)
# The tests and `make image` besides: htpasswd for the authenticated registry, the image
# builder's mmdebstrap and skopeo, the compose tier's dockerd and docker-compose, tini
# for the storage conformance run's PID namespace, and the Prometheus that scrapes a node
# as kube-prometheus would (tests/cluster/test_prometheus_scrape.py; not started here),
# socat to relay the apiserver into the systemd tier's node container.
TEST_PACKAGES=(apache2-utils mmdebstrap skopeo docker.io docker-compose tini prometheus socat)
APT_PACKAGES=("${RUN_PACKAGES[@]}")
if [ "${1:-}" != "--run" ]; then
  APT_PACKAGES+=("${TEST_PACKAGES[@]}")
fi
UV_VERSION=0.13.9

began=$(date +%s%3N)
took() {  # took <what>: how long since the last step ended (milliseconds, no bc needed)
  local now ms
  now=$(date +%s%3N)
  ms=$((now - began))
  printf 'setup: %s (%d.%d s)\n' "$1" $((ms / 1000)) $((ms % 1000 / 100))
  began=$now
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# klet tools/setup.sh: no service starts while it installs packages\nexit 101\n' \
      > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  took "installed ${#missing[@]} Debian package(s)"
fi
began=$(date +%s%3N)

UV=.cache/bootstrap/bin/uv
if [ ! -x "$UV" ] || ! "$UV" --version 2>/dev/null | grep -q "$UV_VERSION"; then
  echo "setup: installing uv $UV_VERSION"
  python3 -m venv .cache/bootstrap
  .cache/bootstrap/bin/pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  took "installed uv $UV_VERSION"
fi
began=$(date +%s%3N)

# --frozen: install exactly uv.lock; the lock is committed and CI never re-resolves.
# --compile-bytecode: the installed packages get their .pyc files now (about 15 s once,
# a no-op later), as the image's do. Without them every service compiles its imports at
# each start (about 3 s of CPU each) and keeps 5-13 MB more resident from the compiler,
# and where PYTHONDONTWRITEBYTECODE is set (as on the shared test machines) that never
# stops. The workspace's own sources are compiled below.
"$UV" sync --all-packages --frozen --quiet --compile-bytecode
took "virtualenv .venv in line with uv.lock (the workspace packages, the test bed too, editable)"

stamp=libs/src/klet/rpc/gen/.stamp
if [ ! -f "$stamp" ] || [ -n "$(find proto tools/gen_proto.py -newer "$stamp" 2>/dev/null)" ]; then
  .venv/bin/python tools/gen_proto.py
  touch "$stamp"
  took "generated the gRPC stubs"
fi
began=$(date +%s%3N)

# The workspace's own sources (installed editable, so uv does not compile them): Python
# writes their .pyc files on first import, except where PYTHONDONTWRITEBYTECODE is set,
# and there every service start compiles all of klet again, about 2 MB more resident per
# service (issue 15). A source edited later is compiled in memory until the next setup.
# Also the optimised level (-o 2, no docstrings) of these and of the installed packages:
# `klet up` runs the services with PYTHONOPTIMIZE=2 where it finds it (klet.cli.up's
# service_environment: about 15 MB less resident over the five services, issue 42).
# About 20 s on 2 cores once; up-to-date files are skipped later.
.venv/bin/python -m compileall -q -j 0 -o 0 -o 2 libs/src services/*/src >/dev/null
.venv/bin/python -m compileall -q -j 0 -o 2 .venv/lib/python3*/site-packages >/dev/null
took "compiled klet's own sources and the optimised bytecode"

echo "setup: done (CLI at .venv/bin/klet)"
