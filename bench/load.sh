#!/usr/bin/env bash
# Load test: plain Caddy against Caddy with rate_limit, measured in one run.
#
# Builds this project's Caddy (cmd/caddy) and a plain Caddy of the same
# version, then runs wrk against each case, interleaved, ROUNDS times (each
# round in a rotated order), and prints the median requests/s of each case
# and its ratio to plain Caddy, and the median CPU time Caddy (and Redis)
# spent per request, with Caddy's ratio to plain Caddy's, and for Redis how
# many requests a take script call decided on average.
#
#   bash bench/load.sh                  # all cases, 3 rounds of 10 s
#   ROUNDS=5 DURATION=20s bash bench/load.sh
#   CASES="plain memory_allowed" bash bench/load.sh
#   CASES="redis_allowed@83bc118 redis_allowed@HEAD" ROUNDS=6 DURATION=8s BYTES=0 bash bench/load.sh
#                                       # two revisions, alternating
#
# Cases:
#   plain             plain Caddy, `respond "ok"`
#   floor             plain Caddy with a no-op middleware (`vars`): the
#                     least a handler in front of `respond` costs
#   memory_allowed    rate_limit, memory store, every request allowed
#   memory_headers_off  memory_allowed with `headers off`: what the four
#                     X-RateLimit headers cost the response (compare the two)
#   memory_shed_idle  memory_allowed with a `shed` block that never sheds
#                     (what an idle load shedder costs; compare the two)
#   peer_allowed      mholt/caddy-ratelimit, the same zone, every request
#                     allowed (built like this Caddy, from the module proxy
#                     or from PEER_SOURCE, a tarball of its source; skipped,
#                     with a message, when neither is there)
#   peer_many_keys    mholt/caddy-ratelimit, 100,000 distinct keys, all
#                     allowed (events 100: its ring buffer is events long)
#   memory_gcra       memory_allowed with algorithm gcra
#   memory_sliding_window  memory_allowed with algorithm sliding_window
#   memory_sliding_window_many_keys  memory_many_keys with algorithm
#                     sliding_window
#   memory_concurrency  memory_allowed with algorithm concurrency (each
#                     request takes a unit and gives it back)
#   redis_concurrency  the same on Redis: a take and a give-back a request
#   memory_count_status  memory_allowed with count_status 5xx: every answer
#                     is a 200, so every request's cost is given back after
#                     its response (what the give-back costs; compare the two)
#   memory_rejected   rate_limit, memory store, every request answered 429
#   memory_many_keys  rate_limit, memory store, 100,000 distinct keys
#                     (X-Key header drawn at random by wrk), all allowed
#   redis_allowed     rate_limit, Redis store, one key, every request allowed
#   redis_lease_allowed  redis_allowed with lease on
#   redis_count_status  redis_allowed with count_status 5xx: a refund call
#                     after each response
#   redis_lease_count_status  redis_count_status with lease on: the costs go
#                     back into the lease
#   redis_many_keys   rate_limit, Redis store, 10,000 distinct keys drawn at
#                     random, all allowed
#   redis_many_keys_lease  redis_many_keys with lease on
#   redis_rejected    rate_limit, Redis store, every request answered 429
#   CASE@REV          CASE on this Caddy as built at git revision REV
#
# After the rounds it measures the memory store's bytes per key: the RSS
# growth of a Caddy between 20,000 and 200,000 distinct keys, for each
# algorithm in BYTES_ALGORITHMS (default: all but concurrency, whose keys
# go when their requests end; BYTES=0 skips it).
#
# The Redis cases start their own redis-server on a free loopback port.
# Everything listens on 127.0.0.1 only. Needs wrk (Debian package `wrk`,
# installed if missing and apt-get is available) and redis-server for the
# Redis cases.
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
THREADS=${THREADS:-1}
CONNECTIONS=${CONNECTIONS:-32}
CASES=${CASES:-"plain floor memory_allowed memory_shed_idle memory_gcra memory_concurrency memory_count_status peer_allowed memory_rejected memory_many_keys peer_many_keys redis_allowed redis_lease_allowed redis_count_status redis_lease_count_status redis_many_keys redis_many_keys_lease redis_rejected"}
# The other plugin's source, for when the module proxy does not serve it.
PEER_SOURCE=${PEER_SOURCE:-../shared/peers/mholt-caddy-ratelimit.tar.gz}
BYTES=${BYTES:-1}
BYTES_ALGORITHMS=${BYTES_ALGORITHMS:-"sliding_tail fixed_window sliding_window gcra"}
source bench/common.sh

# The peer: the same Caddy with mholt/caddy-ratelimit instead of this module,
# from the module proxy, or else from PEER_SOURCE, unpacked outside this
# tree (nothing of it is copied into the project).
if [[ " $CASES " == *" peer_"* ]]; then
	peer="$OUT/peer-src"
	mkdir -p "$peer"
	caddy_version=$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)
	cat >"$peer/main.go" <<'GO'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-ratelimit"
)

func main() { caddycmd.Main() }
GO
	(cd "$peer" && { [[ -f go.mod ]] || go mod init peer >/dev/null 2>&1; })
	if ! (cd "$peer" && go get "github.com/caddyserver/caddy/v2@$caddy_version" github.com/mholt/caddy-ratelimit@latest) >"$OUT/peer-build.log" 2>&1; then
		if [[ -f $PEER_SOURCE ]]; then
			echo "peer: the module proxy does not serve github.com/mholt/caddy-ratelimit; building it from $PEER_SOURCE" >&2
			rm -rf "$OUT/peer-module" && mkdir -p "$OUT/peer-module"
			tar xzf "$PEER_SOURCE" -C "$OUT/peer-module"
			(cd "$peer" && go mod edit -replace "github.com/mholt/caddy-ratelimit=$OUT/peer-module/caddy-ratelimit" &&
				go get "github.com/caddyserver/caddy/v2@$caddy_version" github.com/mholt/caddy-ratelimit@v0.0.0 && go mod tidy) >>"$OUT/peer-build.log" 2>&1
		fi
	fi
	if ! (cd "$peer" && go build -o "$OUT/caddy-peer" .) >>"$OUT/peer-build.log" 2>&1; then
		echo "peer: github.com/mholt/caddy-ratelimit cannot be built here (see $OUT/peer-build.log); its cases are skipped" >&2
		CASES=${CASES//peer_allowed/}
		CASES=${CASES//peer_many_keys/}
	fi
fi

REDIS_PORT=""
if [[ " $CASES " == *" redis_"* ]]; then
	start_redis
fi

# caddyfile CASE PORT prints the Caddyfile for a case.
caddyfile() {
	local store="" limit="2000000000" window="1m"
	# The bytes cases keep every key for the measurement: a gcra key
	# matters until its TAT, one interval (window/limit) after its one
	# request, which at 2e9 a minute is within the second, and the sweep
	# would take the keys as they are counted; at 100 an hour it is 36 s.
	case $1 in
	*_rejected) limit=1 window=24h ;;
	bytes_*) limit=100 window=1h ;;
	esac
	local lease=""
	[[ $1 == *_lease* ]] && lease="lease on"
	case $1 in
	redis_*) store="store redis {
			address redis://127.0.0.1:$REDIS_PORT/0
			$lease
		}" ;;
	esac
	local period="window $window" algorithm=""
	case $1 in
	memory_gcra) algorithm="algorithm gcra" ;;
	*_concurrency) algorithm="algorithm concurrency" period="" ;;
	memory_sliding_window*) algorithm="algorithm sliding_window" ;;
	bytes_*) algorithm="algorithm ${1#bytes_}" ;;
	*_count_status) algorithm="count_status 5xx" ;;
	esac
	local key="{client_ip}"
	[[ $1 == *_many_keys* || $1 == bytes_* ]] && key="{header.X-Key}"
	local order=""
	[[ $1 == peer_* ]] && order="order rate_limit before basic_auth"
	local headers=""
	[[ $1 == memory_headers_off ]] && headers="headers off"
	local shed=""
	[[ $1 == memory_shed_idle ]] && shed="shed {
			priority {header.X-Priority}
			classes critical normal low
			capacity 1000000
		}"
	cat <<CADDY
{
	admin off
	auto_https off
	persist_config off
	$order
}
http://127.0.0.1:$2 {
CADDY
	case $1 in
	plain) ;;
	floor) echo "	vars bench 1" ;;
	peer_*)
		# Its zone keeps a ring buffer of events timestamps per key:
		# a million for the one key, a hundred for each of many.
		local events=1000000 peer_key="{remote_host}"
		[[ $1 == peer_many_keys ]] && events=100 peer_key="{header.X-Key}"
		cat <<CADDY
	rate_limit {
		zone bench_peer {
			key $peer_key
			events $events
			window $window
		}
	}
CADDY
		;;
	*)
		cat <<CADDY
	rate_limit {
		$store
		$headers
		$shed
		zone bench_$1 {
			key $key
			limit $limit
			$period
			$algorithm
		}
	}
CADDY
		;;
	esac
	cat <<CADDY
	respond "ok"
}
CADDY
}

# run CASE prints the requests/s wrk measured for one case, then the CPU
# time Caddy spent per request in µs, then Redis's (0 without Redis), then
# how many requests a take script call decided on average (0 without Redis).
# CASE@REV runs CASE on this Caddy as built at git revision REV.
run() {
	local name=$1 kase=${1%@*} port bin
	local file=${name//\//_}
	port=$(free_port)
	bin="$OUT/caddy-rl"
	[[ $kase == plain || $kase == floor ]] && bin="$OUT/caddy-plain"
	[[ $kase == peer_* ]] && bin="$OUT/caddy-peer"
	[[ $name == *@* ]] && bin="$OUT/caddy-at-${file#*@}"
	caddyfile "$kase" "$port" >"$OUT/$file.Caddyfile"
	"$bin" run --adapter caddyfile --config "$OUT/$file.Caddyfile" >"$OUT/$file.log" 2>&1 &
	local pid=$!
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
	# One request first, so that on the reject path every measured one is a 429.
	curl -s -o /dev/null "http://127.0.0.1:$port/"
	local expect=200
	[[ $kase == *_rejected ]] && expect=429
	local got
	got=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")
	if [[ $got != "$expect" ]]; then
		echo "case $name: expected $expect, got $got" >&2
		kill "$pid"; wait "$pid" 2>/dev/null || true
		return 1
	fi
	local script=()
	[[ $kase == memory_many_keys || $kase == peer_many_keys ]] && script=(-s "$OUT/many_keys.lua")
	[[ $kase == redis_many_keys* ]] && script=(-s "$OUT/redis_keys.lua")
	local redis_pid=""
	[[ $kase == redis_* ]] && redis_pid=$REDIS_PID
	local cpu0 rcpu0=0 cpu1 rcpu1=0 calls0=0 calls1=0
	cpu0=$(cpu_ticks "$pid")
	[[ -n $redis_pid ]] && rcpu0=$(cpu_ticks "$redis_pid") calls0=$(script_calls)
	wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "${script[@]}" "http://127.0.0.1:$port/" >"$OUT/$file.wrk" 2>&1
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "case $name: Caddy exited during the run; see $OUT/$file.log" >&2
		return 1
	fi
	cpu1=$(cpu_ticks "$pid")
	[[ -n $redis_pid ]] && rcpu1=$(cpu_ticks "$redis_pid") calls1=$(script_calls)
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	# A panic as wrk closes its connections ends Caddy after the numbers
	# were read; it is a failure all the same.
	if grep -q '^panic:' "$OUT/$file.log"; then
		echo "case $name: Caddy panicked; see $OUT/$file.log" >&2
		return 1
	fi
	awk -v c="$((cpu1 - cpu0))" -v r="$((rcpu1 - rcpu0))" -v calls="$((calls1 - calls0))" -v hz="$(getconf CLK_TCK)" '
		/^Requests\/sec:/ {rps = $2}
		/requests in/ {n = $1}
		END {printf "%s %.1f %.1f %.1f\n", rps, c / hz / n * 1e6, r / hz / n * 1e6, calls ? n / calls : 0}' "$OUT/$file.wrk"
}

# script_calls prints how many EVALSHA and EVAL calls the Redis server has
# run; a rejected request answered from the deny cache makes none.
script_calls() {
	redis-cli -p "$REDIS_PORT" info commandstats |
		awk -F'[:,=]' '/^cmdstat_eval(sha)?:/ {n += $3} END {print n + 0}'
}

# Cases named CASE@REV: this Caddy built at each git revision REV, from a
# temporary worktree, so that two revisions are compared in one run.
declare -A BUILT
for c in $CASES; do
	[[ $c == *@* ]] || continue
	rev=${c#*@}
	[[ -n ${BUILT[$rev]:-} ]] && continue
	BUILT[$rev]=1
	tree=$(mktemp -d)
	git worktree add -q --detach "$tree" "$rev"
	echo "building caddy at $rev" >&2
	(cd "$tree" && go build -o "$OUT/caddy-at-${rev//\//_}" ./cmd/caddy)
	git worktree remove --force "$tree"
done

# 100,000 distinct keys (10,000 for Redis), drawn at random for each
# request.
for keys in 100000 10000; do
	file="$OUT/many_keys.lua"
	[[ $keys == 10000 ]] && file="$OUT/redis_keys.lua"
	cat >"$file" <<LUA
math.randomseed(os.time())
request = function()
	return wrk.format("GET", "/", {["X-Key"] = "key-" .. math.random($keys)})
end
LUA
done

# Each round starts one case later than the one before, so that no case
# always runs first or always follows the same one: on a shared VM, where a
# case runs in the round showed in its figure.
declare -A RESULTS CPU RCPU PERCALL
read -ra ORDER <<<"$CASES"
for round in $(seq "$ROUNDS"); do
	shift=$(((round - 1) % ${#ORDER[@]}))
	for c in "${ORDER[@]:shift}" "${ORDER[@]:0:shift}"; do
		read -r rps cpu rcpu percall < <(run "$c")
		echo "round $round  $c  $rps req/s  Caddy $cpu µs/request  Redis $rcpu µs/request  $percall requests/call" >&2
		RESULTS[$c]+="$rps "
		CPU[$c]+="$cpu "
		RCPU[$c]+="$rcpu "
		PERCALL[$c]+="$percall "
	done
done

median() { tr ' ' '\n' | { grep -v '^$' || true; } | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2}'; }

plain="" plain_cpu=""
if [[ -n ${RESULTS[plain]:-} ]]; then
	plain=$(echo "${RESULTS[plain]}" | median)
	plain_cpu=$(echo "${CPU[plain]}" | median)
fi
# Throughput on a shared VM moves with its neighbours; the CPU Caddy spends
# per request moves much less, so both are shown: the second ratio is plain
# Caddy's CPU per request over the case's (above 1 is cheaper than plain).
printf '\n%-22s %12s %9s %12s %9s %12s %9s   %s\n' case "median req/s" "vs plain" "Caddy µs/req" "vs plain" "Redis µs/req" "req/call" "runs (req/s)"
for c in $CASES; do
	m=$(echo "${RESULTS[$c]}" | median)
	cpu=$(echo "${CPU[$c]}" | median)
	rcpu=$(echo "${RCPU[$c]}" | median)
	percall=$(echo "${PERCALL[$c]}" | median)
	ratio="-" cpu_ratio="-"
	if [[ -n $plain ]]; then
		ratio=$(awk -v a="$m" -v b="$plain" 'BEGIN {printf "%.3f", a/b}')
		cpu_ratio=$(awk -v a="$cpu" -v b="$plain_cpu" 'BEGIN {printf "%.3f", b/a}')
	fi
	[[ ${c%@*} == redis_* ]] || rcpu="-"
	# No calls at all: not a Redis case, or one the deny cache answered.
	[[ $percall == 0 || $percall == 0.0* ]] && percall="-"
	printf '%-22s %12s %9s %12s %9s %12s %9s   %s\n' "$c" "$m" "$ratio" "$cpu" "$cpu_ratio" "$rcpu" "$percall" "${RESULTS[$c]}"
done
if [[ -n ${RESULTS[memory_allowed]:-} && -n ${RESULTS[memory_shed_idle]:-} ]]; then
	printf '\nidle shed block: memory_shed_idle / memory_allowed = %s\n' \
		"$(awk -v a="$(echo "${RESULTS[memory_shed_idle]}" | median)" -v b="$(echo "${RESULTS[memory_allowed]}" | median)" 'BEGIN {printf "%.3f", a/b}')"
fi

# bytes_per_key: RSS growth of the memory store between 20,000 and 200,000
# distinct keys, each charged once, for each algorithm.
if [[ $BYTES == 1 ]]; then
	go build -o "$OUT/keys" ./bench/keys
	echo
	for alg in $BYTES_ALGORITHMS; do
		port=$(free_port)
		caddyfile "bytes_$alg" "$port" >"$OUT/bytes.Caddyfile"
		"$OUT/caddy-rl" run --adapter caddyfile --config "$OUT/bytes.Caddyfile" >"$OUT/bytes.log" 2>&1 &
		pid=$!
		PIDS+=("$pid")
		for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
		rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$pid/status"; }
		"$OUT/keys" -url "http://127.0.0.1:$port/" -from 0 -to 20000 >/dev/null
		before=$(rss)
		"$OUT/keys" -url "http://127.0.0.1:$port/" -from 20000 -to 200000 >/dev/null
		after=$(rss)
		kill "$pid"
		wait "$pid" 2>/dev/null || true
		printf 'memory store, %-14s RSS %d MiB at 20k keys, %d MiB at 200k keys: %.0f bytes per key\n' \
			"$alg:" $((before >> 20)) $((after >> 20)) "$(awk -v a="$after" -v b="$before" 'BEGIN {print (a-b)/180000}')"
	done
fi
