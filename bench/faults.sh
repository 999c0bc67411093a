#!/usr/bin/env bash
# The fault run: three Caddy instances (./cmd/caddy) share a Redis store
# while a load asks each key twice its limit, and a fault is injected and
# taken away: Redis killed (and restarted empty), hung (SIGSTOP, SIGCONT),
# 100 ms of added latency and connection resets (a proxy of the tests'),
# a Sentinel failover, a cluster master killed (its replica promoted), and
# an instance killed while it holds leases and concurrency units. Each
# runs with on_store_error allow, deny and local, and lease off and on.
# For each it prints admitted ÷ limit in every window the fault touched,
# the slowest request, 5xx answers, log lines and the time back to exact
# decisions, and fails if a promise broke (see integration/faults_test.go).
#
#   bash bench/faults.sh                    # every fault, every setting
#   RUN='TestFaults/redis_hung' bash bench/faults.sh
#   FAULTS_DEBUG=1 RUN=... bash bench/faults.sh   # and each answer after the
#                                  fault that was not an exact decision
#
# The table goes to bench/out/faults.md, and the full log to
# bench/out/faults.log. Needs redis-server and redis-cli; everything
# listens on 127.0.0.1.
set -euo pipefail

cd "$(dirname "$0")/.."
RUN=${RUN:-TestFaults}
mkdir -p bench/out
OUT=$(cd bench/out && pwd)
rm -f "$OUT/faults.md"
status=0
# The proxy's own timing first: the faults below are only as good as it.
go test -tags faults -count=1 ./internal/faultproxy/ || status=$?
FAULTS_OUT="$OUT/faults.md" go test -tags faults -count=1 -run "$RUN" -v -timeout 60m ./integration/ >"$OUT/faults.log" 2>&1 || status=$?
grep -E '^\s+faults_test.go:[0-9]+: .* \| ' "$OUT/faults.log" | sed -E 's/^\s+faults_test.go:[0-9]+: //' || true
grep -E -- '--- FAIL|^\s+faults_test.go:[0-9]+: (window|the slowest|[0-9]+ answers|[0-9]+ log lines|exact decisions)' "$OUT/faults.log" || true
echo
echo "table: $OUT/faults.md   log: $OUT/faults.log   exit $status"
exit $status
