#!/usr/bin/env bash
# `make test`'s pytest, in two sessions around the Go builds.
#
# On a new machine the Go builds (the control plane, kubeadm, helm, the e2e suite: about
# 18 minutes of CPU on 2 cores) are the longest step before any test runs, and the unit and
# integration tiers need none of their output. So the builds run in the background at
# the lowest CPU priority (nice 19: the tests' processes come first, the compiler takes
# the CPU they leave while they wait on containers and timers) beside a first session of
# those two tiers; a second session runs every other tier once the builds are done. Two
# builds of the same thing never race: each build script holds a lock on its cache
# (tools/e2e/build.sh is also run by tests/integration/test_e2e_images.py). With the
# builds cached they are no-ops and the two sessions follow each other at once.
#
# Arguments are pytest's, passed to both sessions. Exit status: the first failure's (a
# failed build is 2, with its log), 5 when neither session collected a test, 0 when
# everything passed.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
mkdir -p .cache
builds_log=.cache/test-builds.log

# kubeadm-binary: kubeadm's smoke (tests/kubeadm/test_kubeadm_in_make_test.py);
# csi-test-binaries: the CSI components of the CSI tests in make test (the database on
# csi-hostpath among them), so none of them builds inside a test; dra-binary: upstream's DRA
# test driver of the DRA smoke (tests/cluster/test_controllers.py), after e2e-binaries: it
# builds offline from the modules and build cache the control plane and e2e.test leave
# (13 s then, measured with an empty dra cache).
nice -n 19 make --no-print-directory cluster-binaries kubeadm-binary helm-binaries e2e-binaries csi-test-binaries \
  dra-binary >"$builds_log" 2>&1 &
builds=$!
# Whatever happens to this script, the builds do not outlive it.
trap 'kill "$builds" 2>/dev/null' EXIT

"$PY" -m pytest tests/unit tests/integration "$@"
first=$?
# Interrupted (Ctrl-C), an internal error or a usage error: no second session.
case "$first" in
  2 | 3 | 4) exit "$first" ;;
esac

wait "$builds"
built=$?
trap - EXIT
cat "$builds_log"
if [ "$built" -ne 0 ]; then
  echo "make test: the Go builds failed (exit $built; log above, also in $builds_log)" >&2
  exit 2
fi

"$PY" -m pytest --ignore=tests/unit --ignore=tests/integration "$@"
second=$?

# pytest's 5 is "collected nothing": a failure when neither session ran a test, not when
# arguments (-k, a path) leave one of them nothing to run.
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then
  exit 5
fi
[ "$first" -eq 5 ] && first=0
[ "$second" -eq 5 ] && second=0
if [ "$first" -ne 0 ]; then
  echo "make test: the unit and integration session failed (exit $first); see its summary above" >&2
  exit "$first"
fi
exit "$second"
