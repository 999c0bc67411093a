#!/usr/bin/env bash
# Load test: plain Caddy against Caddy with rate_limit, measured in one run.
#
# Builds this project's Caddy (cmd/caddy) and a plain Caddy of the same
# version, then runs wrk -t1 -c32 against each case, ROUNDS times, each
# round in an order of its own drawn at random (shuf), so that no case
# always runs first or always follows the same one. Its headline is the
# CPU time Caddy spent per request (user + system from /proc/<pid>/stat,
# over the requests wrk counted), median over the rounds, and its ratio
# to plain Caddy's (above 1 is cheaper than plain); beside it the median
# requests/s and its ratio to plain, and for Redis the CPU Redis spent per
# request and per decision (INFO commandstats: the script calls' usec) and
# how many requests a take script call decided. It ends with each target
# of the cost of a decision (plain, the floor, the memory store allowed,
# rejected and with 100,000 keys, Redis exact with one key and 10,000
# keys, Redis with lease on, the peer) marked met or not met, and
# go-redis/redis_rate's Redis CPU per decision (bench/redisrate) against
# the same Redis, one key and 10,000 keys, beside the Redis store's.
#
#   bash bench/load.sh                  # the default cases, 7 rounds of 15 s: about 20 minutes
#   ROUNDS=3 DURATION=5s bash bench/load.sh
#   CASES="plain floor memory_allowed" bash bench/load.sh
#   CASES="redis_allowed@83bc118 redis_allowed@HEAD" ROUNDS=6 DURATION=8s bash bench/load.sh
#                                       # two revisions, in the same run
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
#                     request takes a unit and releases it)
#   redis_concurrency  the same on Redis: a take and a release a request
#   memory_count_status  memory_allowed with count_status 5xx: every answer
#                     is a 200, so every request's cost is released after
#                     its response (what the release costs; compare the two)
#   memory_rejected   rate_limit, memory store, every request answered 429
#   memory_many_keys  rate_limit, memory store, 100,000 distinct keys
#                     (X-Key header drawn at random by wrk), all allowed
#   redis_allowed     rate_limit, Redis store, one key, every request allowed
#   redis_lease_allowed  redis_allowed with lease on
#   redis_count_status  redis_allowed with count_status 5xx: a release call
#                     after each response
#   redis_lease_count_status  redis_count_status with lease on: the costs are
#                     released into the lease
#   redis_many_keys   rate_limit, Redis store, 10,000 distinct keys drawn at
#                     random, all allowed
#   redis_many_keys_lease  redis_many_keys with lease on
#   redis_rejected    rate_limit, Redis store, every request answered 429
#   memory_rotating   memory_allowed keyed by X-Key, a fresh key for every
#                     request (compare its CPU per request with memory_allowed)
#   flood_memory      a key-rotation flood: CONNECTIONS-4 connections send a
#                     fresh X-Key with every request while 4 more send one hot
#                     key, side by side, to a zone of 1,000 a minute; prints
#                     the flood's and the hot key's requests/s and the hot
#                     key's p99 latency
#   flood_redis       flood_memory on the Redis store
#   flood_redis_lease flood_redis with lease on (compare the two)
#   tokens_json       a zone with cost_from usage total and reserve 100, in
#                     front of a 2 KB Chat Completions answer (respond)
#   fixed_json        the same zone and answer with a fixed cost (cost * 60):
#                     what reading the usage costs (compare the two)
#   tokens_stream     tokens_json with a streamed answer of 200 events
#   fixed_stream      fixed_json with the same stream
#   tokens_proxy_json, fixed_proxy_json, tokens_proxy_stream,
#   fixed_proxy_stream  the same four in front of a model server
#                     (bench/llm, reverse_proxy) that writes and flushes
#                     each event of its stream on its own, as model
#                     servers do
#   tokens_proxy_gemini, fixed_proxy_gemini  the proxied stream as Google's
#                     Gemini API sends it: 200 chunks, each with its
#                     usageMetadata so far
#   redisrate         go-redis/redis_rate deciding against the same Redis,
#                     one key, 32 concurrent callers (bench/redisrate, a
#                     module of its own): Redis CPU per decision
#   redisrate_many_keys  the same over 10,000 keys drawn at random
#   CASE@REV          CASE on this Caddy as built at git revision REV
#
# SOAK=1 then runs 60 s (SOAK_DURATION) of key rotation at full speed
# against a Redis store with lease on, with top keys counting, a key
# banned in a second zone and an override set through the admin API, and
# prints Caddy's RSS every 10 s: the per-key structures must keep it flat.
#
# After the rounds it measures the memory store's bytes per key: the RSS
# growth of a Caddy between 20,000 and 200,000 distinct keys, for each
# algorithm in BYTES_ALGORITHMS (default: all but concurrency, whose keys
# go when their requests end) with BYTES=1 (off by default: it is not
# among the targets, and takes minutes).
#
# The Redis cases start their own redis-server on a free loopback port.
# Everything listens on 127.0.0.1 only. Needs wrk (Debian package `wrk`,
# installed if missing and apt-get is available) and redis-server for the
# Redis cases.
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-7}
DURATION=${DURATION:-15s}
THREADS=${THREADS:-1}
CONNECTIONS=${CONNECTIONS:-32}
# The cases of the targets, and redis_rate beside the Redis store.
CASES=${CASES:-"plain floor memory_allowed memory_rejected memory_many_keys redis_allowed redis_many_keys redis_lease_allowed peer_allowed peer_many_keys redisrate redisrate_many_keys"}
# The other plugin's source, for when the module proxy does not serve it:
# shared/peers beside the repository (of the main checkout, for a git
# worktree elsewhere).
PEER_SOURCE=${PEER_SOURCE:-$(git rev-parse --path-format=absolute --git-common-dir)/../../shared/peers/mholt-caddy-ratelimit.tar.gz}
BYTES=${BYTES:-0}
SOAK=${SOAK:-0}
SOAK_DURATION=${SOAK_DURATION:-60}
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
if [[ " $CASES " == *" redis"* || " $CASES " == *"_redis"* || $SOAK == 1 ]]; then
	start_redis
fi
if [[ " $CASES " == *" redisrate"* ]]; then
	(cd bench/redisrate && go build -o "$OUT/redisrate" .)
fi

# The proxied token cases' upstream: bench/llm, answering as a model
# server does.
LLM_PORT=""
if [[ " $CASES " == *"_proxy_"* ]]; then
	go build -o "$OUT/llm" ./bench/llm
	LLM_PORT=$(free_port)
	"$OUT/llm" -listen "127.0.0.1:$LLM_PORT" >"$OUT/llm.log" 2>&1 &
	PIDS+=("$!")
	for _ in $(seq 50); do curl -fs -o /dev/null "http://127.0.0.1:$LLM_PORT/json" && break; sleep 0.1; done
fi

# llm_json prints a 2 KB Chat Completions answer, as an OpenAI-compatible
# API sends it, with its usage last.
llm_json() {
	local text
	text=$(printf 'lorem ipsum dolor sit amet %.0s' $(seq 70))
	printf '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"%s"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":40,"total_tokens":60}}' "$text"
}

# llm_stream prints a streamed Chat Completion of 200 events: 198 chunks of
# text, the usage chunk and [DONE].
llm_stream() {
	local i
	for i in $(seq 198); do
		printf 'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
	done
	printf 'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":198,"total_tokens":218}}\n\n'
	printf 'data: [DONE]\n\n'
}

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
	flood_*) limit=1000 ;;
	tokens_* | fixed_*) window=1h ;;
	esac
	local lease=""
	[[ $1 == *_lease* ]] && lease="lease on"
	case $1 in
	redis_* | flood_redis*) store="store redis {
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
	# The token cases answer as an LLM API does; tokens_* reads the
	# answer's usage, fixed_* is the same zone with a fixed cost.
	local answer="respond \"ok\""
	case $1 in
	tokens_json | fixed_json)
		answer="header Content-Type application/json
	respond \`$(llm_json)\`" ;;
	tokens_stream | fixed_stream)
		answer="header Content-Type text/event-stream
	respond \`$(llm_stream)\`" ;;
	*_proxy_json) answer="rewrite * /json
	reverse_proxy 127.0.0.1:$LLM_PORT" ;;
	*_proxy_stream) answer="rewrite * /stream
	reverse_proxy 127.0.0.1:$LLM_PORT" ;;
	*_proxy_gemini) answer="rewrite * /gemini
	reverse_proxy 127.0.0.1:$LLM_PORT" ;;
	esac
	case $1 in
	tokens_*) algorithm="cost_from usage total
			reserve 100" ;;
	fixed_*) algorithm="cost * 60" ;;
	esac
	local key="{client_ip}"
	[[ $1 == *_many_keys* || $1 == bytes_* || $1 == flood_* || $1 == memory_rotating ]] && key="{header.X-Key}"
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
	$answer
}
CADDY
}

# start_case NAME starts a Caddy for case NAME (CASE or CASE@REV) on a free
# port and waits until it answers as the case expects, setting PID and PORT
# and FILE (the case's name for files in $OUT).
start_case() {
	local name=$1 kase=${1%@*} bin
	FILE=${name//\//_}
	PORT=$(free_port)
	bin="$OUT/caddy-rl"
	[[ $kase == plain || $kase == floor ]] && bin="$OUT/caddy-plain"
	[[ $kase == peer_* ]] && bin="$OUT/caddy-peer"
	[[ $name == *@* ]] && bin="$OUT/caddy-at-${FILE#*@}"
	caddyfile "$kase" "$PORT" >"$OUT/$FILE.Caddyfile"
	"$bin" run --adapter caddyfile --config "$OUT/$FILE.Caddyfile" >"$OUT/$FILE.log" 2>&1 &
	PID=$!
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.05; done
	# One request first, so that on the reject path every measured one is a 429.
	curl -s -o /dev/null "http://127.0.0.1:$PORT/"
	local expect=200
	[[ $kase == *_rejected ]] && expect=429
	local got
	got=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Key: check' "http://127.0.0.1:$PORT/")
	if [[ $got != "$expect" ]]; then
		echo "case $name: expected $expect, got $got" >&2
		kill "$PID"; wait "$PID" 2>/dev/null || true
		return 1
	fi
}

# stop_case NAME stops the case's Caddy, failing if it exited or panicked
# during the run.
stop_case() {
	if ! kill -0 "$PID" 2>/dev/null; then
		echo "case $1: Caddy exited during the run; see $OUT/$FILE.log" >&2
		return 1
	fi
	kill "$PID" 2>/dev/null || true
	wait "$PID" 2>/dev/null || true
	# A panic as wrk closes its connections ends Caddy after the numbers
	# were read; it is a failure all the same.
	if grep -q '^panic:' "$OUT/$FILE.log"; then
		echo "case $1: Caddy panicked; see $OUT/$FILE.log" >&2
		return 1
	fi
}

# run CASE prints the requests/s wrk measured for one case, then the CPU
# time Caddy spent per request in µs, then Redis's (0 without Redis), then
# how many requests a take script call decided on average (0 without Redis).
# CASE@REV runs CASE on this Caddy as built at git revision REV.
run() {
	local name=$1 kase=${1%@*}
	start_case "$name" || return 1
	local script=()
	[[ $kase == memory_many_keys || $kase == peer_many_keys ]] && script=(-s "$OUT/many_keys.lua")
	[[ $kase == redis_many_keys* ]] && script=(-s "$OUT/redis_keys.lua")
	[[ $kase == memory_rotating ]] && script=(-s "$OUT/rotate.lua")
	local redis_pid=""
	[[ $kase == redis_* ]] && redis_pid=$REDIS_PID
	local cpu0 rcpu0=0 cpu1 rcpu1=0 calls0=0 calls1=0 usec0=0 usec1=0
	cpu0=$(cpu_ticks "$PID")
	[[ -n $redis_pid ]] && rcpu0=$(cpu_ticks "$redis_pid") && read -r calls0 usec0 < <(script_stats)
	wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "${script[@]}" "http://127.0.0.1:$PORT/" >"$OUT/$FILE.wrk" 2>&1
	cpu1=$(cpu_ticks "$PID")
	[[ -n $redis_pid ]] && rcpu1=$(cpu_ticks "$redis_pid") && read -r calls1 usec1 < <(script_stats)
	local ttfb=0
	[[ $kase == tokens_* || $kase == fixed_* ]] && ttfb=$(first_byte_ms)
	stop_case "$name" || return 1
	awk -v c="$((cpu1 - cpu0))" -v r="$((rcpu1 - rcpu0))" -v calls="$((calls1 - calls0))" -v usec="$((usec1 - usec0))" -v hz="$(getconf CLK_TCK)" -v ttfb="$ttfb" '
		/^Requests\/sec:/ {rps = $2}
		/requests in/ {n = $1}
		END {printf "%s %.1f %.1f %.1f %s %.2f\n", rps, c / hz / n * 1e6, r / hz / n * 1e6, calls ? n / calls : 0, ttfb, usec / n}' "$OUT/$FILE.wrk"
}

# run_redisrate CASE runs bench/redisrate against the Redis of the run
# for DURATION, one key (redisrate) or 10,000 (redisrate_many_keys), and
# prints its decisions a second and Redis's CPU per decision in µs.
run_redisrate() {
	local keys=1
	[[ $1 == redisrate_many_keys ]] && keys=10000
	"$OUT/redisrate" -addr "127.0.0.1:$REDIS_PORT" -keys "$keys" -clients "$CONNECTIONS" -duration "$(duration_seconds)s" >"$OUT/$1.out"
	awk '{print $3, $2}' "$OUT/$1.out"
}

# duration_seconds prints DURATION (wrk's 15s, 1m) in seconds.
duration_seconds() {
	case $DURATION in
	*m) echo $((${DURATION%m} * 60)) ;;
	*s) echo "${DURATION%s}" ;;
	*) echo "$DURATION" ;;
	esac
}

# first_byte_ms prints the median time to the first byte of the answer, in
# ms, over 50 requests one after another to the case on PORT (after its
# load, so that it is warm).
first_byte_ms() {
	local i
	for i in $(seq 50); do
		curl -s -o /dev/null -w '%{time_starttransfer}\n' "http://127.0.0.1:$PORT/"
	done | sort -g | awk '{a[NR] = $1} END {printf "%.3f", a[int((NR + 1) / 2)] * 1000}'
}

# run_flood CASE runs a key-rotation flood: CONNECTIONS-4 connections send
# a fresh key with every request while 4 more send one hot key, at once.
# It prints the flood's requests/s, the hot key's requests/s, the hot key's
# p99 latency in ms, and the CPU time Caddy spent per request (both kinds)
# in µs.
run_flood() {
	local name=$1
	start_case "$name" || return 1
	local cpu0 cpu1 flood
	cpu0=$(cpu_ticks "$PID")
	wrk -t1 -c"$((CONNECTIONS - 4))" -d"$DURATION" -s "$OUT/rotate.lua" "http://127.0.0.1:$PORT/" >"$OUT/$FILE.flood.wrk" 2>&1 &
	flood=$!
	wrk -t1 -c4 -d"$DURATION" --latency -H 'X-Key: hot' "http://127.0.0.1:$PORT/" >"$OUT/$FILE.hot.wrk" 2>&1
	wait "$flood"
	cpu1=$(cpu_ticks "$PID")
	stop_case "$name" || return 1
	awk -v c="$((cpu1 - cpu0))" -v hz="$(getconf CLK_TCK)" '
		FNR == 1 {f++}
		/^Requests\/sec:/ {rps[f] = $2}
		/requests in/ {n += $1}
		f == 2 && $1 == "99%" {
			v = $2 + 0
			if ($2 ~ /us$/) v /= 1000; else if ($2 ~ /[^m]s$/) v *= 1000
			p99 = v
		}
		END {printf "%s %s %.2f %.1f\n", rps[1], rps[2], p99, c / hz / n * 1e6}' "$OUT/$FILE.flood.wrk" "$OUT/$FILE.hot.wrk"
}

# script_stats prints how many EVALSHA and EVAL calls the Redis server has
# run, and the CPU time in µs it spent in them; a rejected request answered
# from the deny cache makes none. The instances' announcements (the one
# script that calls HGETALL, once a second) are left out of the calls.
script_stats() {
	redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
		awk -F'[:,=]' '/^cmdstat_eval(sha)?:/ {n += $3; u += $5} /^cmdstat_hgetall:/ {h += $3} END {print n - h, u + 0}'
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

# A fresh key for every request: a random prefix for each run, then a
# count.
cat >"$OUT/rotate.lua" <<'LUA'
local n = 0
local prefix
init = function(args)
	math.randomseed(os.time() + math.floor(os.clock() * 1e6))
	prefix = string.format("r%d-", math.random(1, 2 ^ 30))
end
request = function()
	n = n + 1
	return wrk.format("GET", "/", {["X-Key"] = prefix .. n})
end
LUA

# Each round runs the cases in an order of its own, drawn at random, so
# that no case always runs first or always follows the same one: on a
# shared VM, where a case runs in the round showed in its figure.
declare -A RESULTS CPU RCPU PERCALL HOT HOTP99 TTFB DECISION
read -ra ORDER <<<"$CASES"
for round in $(seq "$ROUNDS"); do
	mapfile -t shuffled < <(printf '%s\n' "${ORDER[@]}" | shuf)
	for c in "${shuffled[@]}"; do
		if [[ $c == redisrate* ]]; then
			read -r rps usec < <(run_redisrate "$c")
			echo "round $round  $c  $rps decisions/s  Redis $usec µs/decision" >&2
			RESULTS[$c]+="$rps "
			DECISION[$c]+="$usec "
			continue
		fi
		if [[ ${c%@*} == flood_* ]]; then
			read -r rps hot p99 cpu < <(run_flood "$c")
			echo "round $round  $c  flood $rps req/s  hot key $hot req/s, p99 $p99 ms  Caddy $cpu µs/request" >&2
			RESULTS[$c]+="$rps "
			HOT[$c]+="$hot "
			HOTP99[$c]+="$p99 "
			CPU[$c]+="$cpu "
			continue
		fi
		read -r rps cpu rcpu percall ttfb decision < <(run "$c")
		TTFB[$c]+="$ttfb "
		DECISION[$c]+="$decision "
		echo "round $round  $c  Caddy $cpu µs/request  $rps req/s  Redis $rcpu µs/request, $decision µs/decision in scripts  $percall requests/call" >&2
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
# CPU per request is the headline: throughput on a shared VM moves with
# its neighbours, the CPU Caddy spends per request much less. Each ratio
# is to plain Caddy in this run; for CPU it is plain's over the case's
# (above 1 is cheaper than plain).
printf '\n%-22s %12s %9s %12s %9s %12s %12s %9s   %s\n' case "Caddy µs/req" "vs plain" "median req/s" "vs plain" "Redis µs/req" "µs/decision" "req/call" "runs (Caddy µs/req)"
for c in $CASES; do
	[[ ${c%@*} == flood_* ]] && continue
	m=$(echo "${RESULTS[$c]}" | median)
	if [[ $c == redisrate* ]]; then
		printf '%-22s %12s %9s %12s %9s %12s %12s %9s   %s\n' "$c" - - "$m" - - "$(echo "${DECISION[$c]}" | median)" - "(decisions/s; redis_rate, not Caddy)"
		continue
	fi
	cpu=$(echo "${CPU[$c]}" | median)
	rcpu=$(echo "${RCPU[$c]}" | median)
	percall=$(echo "${PERCALL[$c]}" | median)
	decision=$(echo "${DECISION[$c]}" | median)
	ratio="-" cpu_ratio="-"
	if [[ -n $plain ]]; then
		ratio=$(awk -v a="$m" -v b="$plain" 'BEGIN {printf "%.3f", a/b}')
		cpu_ratio=$(awk -v a="$cpu" -v b="$plain_cpu" 'BEGIN {printf "%.3f", b/a}')
	fi
	[[ ${c%@*} == redis_* ]] || rcpu="-" decision="-"
	# No calls at all: not a Redis case, or one the deny cache answered.
	[[ $percall == 0 || $percall == 0.0* ]] && percall="-"
	printf '%-22s %12s %9s %12s %9s %12s %12s %9s   %s\n' "$c" "$cpu" "$cpu_ratio" "$m" "$ratio" "$rcpu" "$decision" "$percall" "${CPU[$c]}"
done

# The targets of the cost of a decision, each from this run's medians:
# met or not met. A case not run leaves its target out.
has() { [[ -n ${CPU[$1]:-} ]]; }
med() { echo "${CPU[$1]}" | median; }
rps() { echo "${RESULTS[$1]}" | median; }
of_plain() { awk -v a="$(med "$1")" -v b="$plain_cpu" 'BEGIN {printf "%.3f", b/a}'; }
verdict() { awk "BEGIN {exit !($1)}" && echo met || echo "not met"; }
if [[ -n $plain ]]; then
	printf '\n%-52s %-36s %s\n' target measured verdict
	if has floor && has memory_allowed; then
		a=$(of_plain memory_allowed) f=$(of_plain floor)
		printf '%-52s %-36s %s\n' "memory allowed: CPU within 0.03 of the floor" "$a of plain, floor $f" "$(verdict "$a >= $f - 0.03")"
	fi
	if has memory_allowed && has memory_rejected; then
		printf '%-52s %-36s %s\n' "memory rejected: no dearer than allowed" "$(med memory_rejected) vs $(med memory_allowed) µs/req" "$(verdict "$(med memory_rejected) <= $(med memory_allowed)")"
	fi
	if has memory_allowed && has memory_many_keys; then
		a=$(of_plain memory_allowed) k=$(of_plain memory_many_keys)
		printf '%-52s %-36s %s\n' "memory 100,000 keys: within 0.05 of one key" "$k of plain, one key $a" "$(verdict "$k >= $a - 0.05")"
	fi
	for c in redis_allowed redis_many_keys; do
		has $c || continue
		r=$(awk -v a="$(rps $c)" -v b="$plain" 'BEGIN {printf "%.3f", a/b}')
		x=$(awk -v a="$(med $c)" -v b="$plain_cpu" 'BEGIN {printf "%.3f", a/b}')
		printf '%-52s %-36s %s\n' "$c (lease off): >= 0.75 of plain req/s" "$r" "$(verdict "$r >= 0.75")"
		printf '%-52s %-36s %s\n' "$c (lease off): CPU within 1.25x plain" "${x}x" "$(verdict "$x <= 1.25")"
	done
	if has redis_lease_allowed; then
		r=$(awk -v a="$(rps redis_lease_allowed)" -v b="$plain" 'BEGIN {printf "%.3f", a/b}')
		printf '%-52s %-36s %s\n' "redis lease on, hot key: >= 0.90 of plain req/s" "$r" "$(verdict "$r >= 0.90")"
	fi
	for c in peer_allowed peer_many_keys; do
		has $c || continue
		printf '%-52s %-36s %s\n' "the peer, $c (printed beside, no target)" "$(of_plain $c) of plain CPU" "-"
	done
	has peer_allowed && echo "(the peer with one key keeps a ring of 1,000,000 timestamps: its large heap makes Go's collector run less often, so it can measure cheaper than plain Caddy)"
	for pair in "redis_allowed redisrate" "redis_many_keys redisrate_many_keys"; do
		read -r ours theirs <<<"$pair"
		[[ -n ${DECISION[$ours]:-} && -n ${DECISION[$theirs]:-} ]] || continue
		printf 'Redis CPU per decision (INFO commandstats), %s: ours %s µs, go-redis/redis_rate %s µs (%s)\n' "$ours" \
			"$(echo "${DECISION[$ours]}" | median)" "$(echo "${DECISION[$theirs]}" | median)" "$theirs"
	done
fi

# The token cases: what reading the usage costs, the case that reads it
# beside the same zone with a fixed cost (CPU per request, above 1 dearer),
# and the median time to the first byte of each.
for kind in json stream proxy_json proxy_stream proxy_gemini; do
	t=tokens_$kind f=fixed_$kind
	[[ -n ${CPU[$t]:-} && -n ${CPU[$f]:-} ]] || continue
	tc=$(echo "${CPU[$t]}" | median) fc=$(echo "${CPU[$f]}" | median)
	tt=$(echo "${TTFB[$t]}" | median) ft=$(echo "${TTFB[$f]}" | median)
	printf '%-14s Caddy µs/req %s vs %s with a fixed cost (%s)   first byte %s ms vs %s ms\n' "$t" "$tc" "$fc" "$(awk -v a="$tc" -v b="$fc" 'BEGIN {printf "%.3f", a/b}')" "$tt" "$ft"
done
if [[ " $CASES " == *" flood_"* ]]; then
	printf '\n%-22s %12s %12s %12s %12s   %s\n' "flood case" "flood req/s" "hot req/s" "hot p99 ms" "Caddy µs/req" "runs (hot p99 ms)"
	for c in $CASES; do
		[[ ${c%@*} == flood_* ]] || continue
		printf '%-22s %12s %12s %12s %12s   %s\n' "$c" "$(echo "${RESULTS[$c]}" | median)" "$(echo "${HOT[$c]}" | median)" \
			"$(echo "${HOTP99[$c]}" | median)" "$(echo "${CPU[$c]}" | median)" "${HOTP99[$c]}"
	done
	if [[ -n ${RESULTS[flood_redis]:-} && -n ${RESULTS[flood_redis_lease]:-} ]]; then
		ratio() { awk -v a="$(echo "$1" | median)" -v b="$(echo "$2" | median)" 'BEGIN {printf "%.3f", a/b}'; }
		printf 'lease on / lease off under the flood: hot p99 %s, flood req/s %s, hot req/s %s\n' \
			"$(ratio "${HOTP99[flood_redis_lease]}" "${HOTP99[flood_redis]}")" \
			"$(ratio "${RESULTS[flood_redis_lease]}" "${RESULTS[flood_redis]}")" \
			"$(ratio "${HOT[flood_redis_lease]}" "${HOT[flood_redis]}")"
	fi
fi
if [[ -n ${RESULTS[memory_allowed]:-} && -n ${RESULTS[memory_rotating]:-} && -n $plain_cpu ]]; then
	printf '\nmemory store, CPU per request vs plain: one key %s, a fresh key each request %s\n' \
		"$(awk -v a="$(echo "${CPU[memory_allowed]}" | median)" -v b="$plain_cpu" 'BEGIN {printf "%.3f", b/a}')" \
		"$(awk -v a="$(echo "${CPU[memory_rotating]}" | median)" -v b="$plain_cpu" 'BEGIN {printf "%.3f", b/a}')"
fi
if [[ -n ${RESULTS[memory_allowed]:-} && -n ${RESULTS[memory_shed_idle]:-} ]]; then
	printf '\nidle shed block: memory_shed_idle / memory_allowed = %s\n' \
		"$(awk -v a="$(echo "${RESULTS[memory_shed_idle]}" | median)" -v b="$(echo "${RESULTS[memory_allowed]}" | median)" 'BEGIN {printf "%.3f", a/b}')"
fi

# soak: SOAK_DURATION seconds of key rotation at full speed, Redis store
# with lease on, a banned key in a second zone and an override in force;
# Caddy's RSS every 10 s.
if [[ $SOAK == 1 ]]; then
	port=$(free_port) admin=$(free_port)
	cat >"$OUT/soak.Caddyfile" <<CADDY
{
	admin 127.0.0.1:$admin
	auto_https off
	persist_config off
}
http://127.0.0.1:$port {
	rate_limit {
		store redis {
			address redis://127.0.0.1:$REDIS_PORT/0
			lease on
		}
		zone soak {
			key {header.X-Key}
			limit 1000
			window 1m
		}
		zone soak_login {
			match {
				path /login
			}
			key {header.X-Key}
			limit 2
			window 1h
			ban 1h
		}
	}
	respond "ok"
}
CADDY
	"$OUT/caddy-rl" run --adapter caddyfile --config "$OUT/soak.Caddyfile" >"$OUT/soak.log" 2>&1 &
	pid=$!
	PIDS+=("$pid")
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
	for _ in 1 2 3; do curl -s -o /dev/null -H 'X-Key: attacker' "http://127.0.0.1:$port/login"; done
	banned=$(curl -s -o /dev/null -w '%{http_code} %header{retry-after}' -H 'X-Key: attacker' "http://127.0.0.1:$port/login")
	curl -s -o /dev/null -X PUT -H 'Content-Type: application/json' -d '{"limit": 5000, "ttl": "1h"}' \
		"http://127.0.0.1:$admin/rate_limit/zones/soak/keys/vip/limit"
	override=$(curl -s -o /dev/null -w '%header{x-ratelimit-limit}' -H 'X-Key: vip' "http://127.0.0.1:$port/")
	echo
	echo "soak: banned key answers $banned (status, Retry-After); override key's limit $override"
	wrk -t"$THREADS" -c"$CONNECTIONS" -d"${SOAK_DURATION}s" -s "$OUT/rotate.lua" "http://127.0.0.1:$port/" >"$OUT/soak.wrk" 2>&1 &
	soak=$!
	rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$pid/status"; }
	samples=()
	for t in $(seq 10 10 "$SOAK_DURATION"); do
		sleep 10
		samples+=("$(rss)")
		printf 'soak: %3d s, RSS %d MiB\n' "$t" $(($(rss) >> 20))
	done
	wait "$soak"
	grep -E '^Requests/sec|requests in' "$OUT/soak.wrk" | sed 's/^/soak: /'
	printf 'soak: RSS at the end / at 10 s = %s\n' "$(awk -v a="${samples[-1]}" -v b="${samples[0]}" 'BEGIN {printf "%.3f", a/b}')"
	kill "$pid"
	wait "$pid" 2>/dev/null || true
fi

# bytes_per_key: RSS growth of the memory store between 20,000 and 200,000
# distinct keys, each taken once, for each algorithm.
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
