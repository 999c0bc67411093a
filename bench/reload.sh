#!/usr/bin/env bash
# Reloads under load: while wrk runs against a zone that never rejects,
# 100 admin-API reloads (POST /load) alternate between two configs. It does
# the same with plain Caddy, and reports, for each, wrk's connection errors
# and non-2xx answers, the reload failures, and for the plugin whether the
# counter holds every answered request, and the goroutines (and Redis
# connections) before and after.
#
#   bash bench/reload.sh                 # plain, memory and redis
#   RELOADS=50 CASES="plain memory" bash bench/reload.sh
#
# Everything listens on 127.0.0.1. Needs wrk, curl and, for the redis case,
# redis-server and redis-cli.
set -euo pipefail

cd "$(dirname "$0")/.."
RELOADS=${RELOADS:-100}
CASES=${CASES:-"plain memory redis"}
source bench/common.sh

REDIS_PORT=""
if [[ " $CASES " == *" redis "* ]]; then
	start_redis
fi

# config CASE ADMIN SITE N prints the Caddyfile: generation N of two.
config() {
	local body
	case $1 in
	plain) body="respond \"gen $4\"" ;;
	*)
		local store=""
		[[ $1 == redis ]] && store="store redis {
			address redis://127.0.0.1:$REDIS_PORT
			timeout 1s
		}"
		body="rate_limit {
		$store
		zone reload {
			key {client_ip}
			limit $((1000000000 + $4))
			window 1h
		}
	}
	respond \"gen $4\""
		;;
	esac
	cat <<CADDY
{
	admin 127.0.0.1:$2
	persist_config off
	grace_period 5s
}
http://127.0.0.1:$3 {
	$body
}
CADDY
}

goroutines() {
	curl -s "http://127.0.0.1:$1/debug/pprof/goroutine?debug=1" | awk 'NR==1 {print $4}'
}

redis_clients() {
	redis-cli -p "$REDIS_PORT" client list | grep -c 'name=caddy-rate-limit' || true
}

printf '%-8s %9s %14s %10s %14s %s\n' case requests "socket errors" non-2xx "reload fails" "kept"
for c in $CASES; do
	admin=$(free_port)
	site=$(free_port)
	bin="$OUT/caddy-rl"
	[[ $c == plain ]] && bin="$OUT/caddy-plain"
	config "$c" "$admin" "$site" 0 >"$OUT/reload-$c.Caddyfile"
	"$bin" run --adapter caddyfile --config "$OUT/reload-$c.Caddyfile" >"$OUT/reload-$c.log" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$site/" && break; sleep 0.05; done
	curl -s -o /dev/null "http://127.0.0.1:$site/"
	g0=$(goroutines "$admin")
	r0=""
	[[ $c == redis ]] && r0=$(redis_clients)

	wrk -t1 -c32 -d600s --latency "http://127.0.0.1:$site/" >"$OUT/reload-$c.wrk" 2>&1 &
	wrk_pid=$!
	sleep 1
	fails=0
	for i in $(seq "$RELOADS"); do
		config "$c" "$admin" "$site" $((i % 2)) >"$OUT/reload-$c.next"
		code=$(curl -s -o "$OUT/reload-$c.body" -w '%{http_code}' -X POST -H 'Content-Type: text/caddyfile' \
			--data-binary @"$OUT/reload-$c.next" "http://127.0.0.1:$admin/load")
		[[ $code == 200 ]] || fails=$((fails + 1))
	done
	sleep 1
	kill -INT "$wrk_pid"
	wait "$wrk_pid" || true

	requests=$(awk '/requests in/ {print $1}' "$OUT/reload-$c.wrk")
	socket=$(awk -F'[ ,]+' '/Socket errors/ {print $4+$6+$8+$10}' "$OUT/reload-$c.wrk")
	non2xx=$(awk '/Non-2xx/ {print $NF}' "$OUT/reload-$c.wrk")
	kept="-"
	if [[ $c != plain ]]; then
		curl -s -o /dev/null "http://127.0.0.1:$site/"
		used=$(curl -s "http://127.0.0.1:$admin/rate_limit/zones/reload/keys/127.0.0.1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["used"])')
		# Every answered request, plus the three curls, is counted; wrk does
		# not report the (at most 32) requests in flight when it stopped.
		kept="counter $used for $((requests + 3)) requests"
		sleep 2
		kept+=", goroutines $g0 -> $(goroutines "$admin")"
		[[ $c == redis ]] && kept+=", redis connections $r0 -> $(redis_clients)"
	fi
	printf '%-8s %9s %14s %10s %14s %s\n' "$c" "$requests" "${socket:-0}" "${non2xx:-0}" "$fails" "$kept"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
done
