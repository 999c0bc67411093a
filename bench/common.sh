# Shared by bench/load.sh and bench/reload.sh (sourced, not run): the output
# folder, wrk, the two Caddy binaries, free ports, a redis-server, and
# stopping what was started.

OUT=${OUT:-bench/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if ! command -v wrk >/dev/null; then
	echo "installing wrk" >&2
	(apt-get update -qq && apt-get install -y -qq wrk) >/dev/null
fi

echo "building caddy with rate_limit and plain caddy ($(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2))" >&2
go build -o "$OUT/caddy-rl" ./cmd/caddy
go build -o "$OUT/caddy-plain" github.com/caddyserver/caddy/v2/cmd/caddy

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# PIDS are killed when the script exits.
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT

# start_redis starts a redis-server on a free loopback port, sets
# REDIS_PORT and REDIS_PID and waits until it answers.
start_redis() {
	REDIS_PORT=$(free_port)
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$OUT/redis-$REDIS_PORT.log" 2>&1 &
	REDIS_PID=$!
	PIDS+=("$REDIS_PID")
	for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

# cpu_ticks PID prints the CPU time (user + system, in clock ticks) that
# process PID has used so far.
cpu_ticks() {
	awk '{print $14 + $15}' "/proc/$1/stat"
}
