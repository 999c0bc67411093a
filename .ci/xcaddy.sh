#!/usr/bin/env bash
# Runs the build commands of xcaddy.md and of the README's Build section as
# they are written, so that what they tell a user to type works. Each ```sh
# block of xcaddy.md, and of the README's "## Build" section, runs in one
# bash with -euo pipefail, from the root of a copy of this checkout, with
# xcaddy's directory on PATH. A line that runs `caddy run` is started in the
# background, with PORT and CADDY_ADMIN set to free loopback ports (where
# Caddyfile.example and Caddy's admin endpoint then listen), must answer
# GET / with rate-limit headers, and is stopped. A block whose fence follows
# the line `<!-- not run in CI: <why> -->` is skipped. It is not part of
# `go test`: two xcaddy builds and a go build of Caddy take minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/blocks" "$work/home" "$work/tmp"

# The checkout as it is now, edits included, without what git ignores;
# each block starts from a fresh copy of it.
git ls-files -z --cached --others --exclude-standard |
	tar --null --files-from=- --ignore-failed-read -cf "$work/checkout.tar" 2>/dev/null

gobin=$(go env GOBIN)
export PATH="${gobin:-$(go env GOPATH)/bin}:$PATH"
# Caddy keeps its autosaved config and its data here, not in $HOME, and
# every temporary file goes where the EXIT trap removes it.
export XDG_CONFIG_HOME=$work/home XDG_DATA_HOME=$work/home TMPDIR=$work/tmp

# extract PREFIX FILE [SECTION]: writes each runnable ```sh block of FILE
# (of its "## SECTION" only, if given) to $work/blocks/PREFIX-FILE-NN.sh,
# and prints how many there are.
extract() {
	awk -v prefix="$1" -v file="$2" -v section="${3:-}" -v dir="$work/blocks" '
		BEGIN { inside = (section == "") }
		/^```/ {
			if (fence) {
				fence = 0
				if (out != "") { close(out); out = "" }
				next
			}
			fence = 1
			if (inside && $0 == "```sh" && prev !~ /^<!-- not run in CI: .+ -->$/) {
				n++
				out = sprintf("%s/%s-%s-%02d.sh", dir, prefix, file, n)
			}
			next
		}
		fence { if (out != "") print > out; next }
		/^## / && section != "" { inside = ($0 == "## " section) }
		/./ { prev = $0 }
		END { print n + 0 }
	' "$repo/$2"
}

for doc in "1 xcaddy.md" "2 README.md Build"; do
	read -r prefix file section <<<"$doc"
	if (($(extract "$prefix" "$file" "$section") == 0)); then
		echo "$file${section:+, section $section}: no \`\`\`sh block to run"
		exit 1
	fi
done

# freeport prints a port that nothing on 127.0.0.1 listens on (and is not
# $1), below the range the kernel hands out to outgoing connections.
freeport() {
	local port
	while :; do
		port=$((20000 + RANDOM % 12000))
		if [[ $port != "${1:-}" ]] && ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
}

# getroot prints the answer to GET / on PORT.
getroot() {
	exec 3<>"/dev/tcp/127.0.0.1/$PORT" || return
	printf 'GET / HTTP/1.0\r\nHost: localhost:%s\r\n\r\n' "$PORT" >&3
	cat <&3
}

# serve runs the command line $1, which starts Caddy with
# Caddyfile.example, in the background; waits until GET / on PORT is
# answered, for at most 15 minutes (a go run compiles Caddy first); stops
# it; and checks that the answer was a 200 with the plugin's
# X-RateLimit-Limit header.
serve() {
	local log pid answer deadline=$((SECONDS + 900))
	log=$(mktemp)
	echo "+ $1    (in the background, until it serves http://localhost:$PORT/)"
	setsid bash -c "$1" >"$log" 2>&1 &
	pid=$!
	trap 'kill -- -'"$pid"' 2>/dev/null' EXIT
	trap 'exit 143' TERM INT
	until answer=$(getroot 2>/dev/null); do
		# Caddy says this once its servers listen.
		if grep -q '"serving initial configuration"' "$log" && ! answer=$(getroot 2>/dev/null); then
			echo "Caddy runs, but nothing answers on port $PORT; its output:"
			cat "$log"
			return 1
		fi
		if ! kill -0 "$pid" 2>/dev/null || ((SECONDS > deadline)); then
			echo "it did not serve; its output:"
			cat "$log"
			return 1
		fi
		sleep 1
	done
	kill -- -"$pid" 2>/dev/null || true
	wait "$pid" || true
	trap - EXIT
	# The next Caddy needs the port.
	while getroot >/dev/null 2>&1; do
		sleep 0.1
	done
	if ! grep -q '^HTTP/1\.[01] 200 ' <<<"$answer" || ! grep -qi '^X-RateLimit-Limit: ' <<<"$answer"; then
		echo "GET / was not answered 200 with rate-limit headers:"
		echo "$answer"
		cat "$log"
		return 1
	fi
	echo "  served: $(head -n1 <<<"$answer" | tr -d '\r'); $(grep -i '^X-RateLimit-Limit: ' <<<"$answer" | tr -d '\r')"
}
export -f getroot serve

PORT=$(freeport)
CADDY_ADMIN=127.0.0.1:$(freeport "$PORT")
export PORT CADDY_ADMIN

for block in "$work"/blocks/*.sh; do
	name=$(basename "$block" .sh)
	script=$work/$name.run
	echo "set -euo pipefail" >"$script"
	# Join continued lines, as the shell does; a line that runs Caddy is
	# handed to serve, every other one runs as it is.
	sed -e ':a' -e '/\\$/{N;s/\\\n//;ba' -e '}' "$block" | while IFS= read -r line; do
		if [[ $line =~ (^|[[:space:]/])caddy[[:space:]]+run([[:space:]]|$) ]]; then
			printf 'serve %q\n' "$line"
		else
			printf 'echo %q\n%s\n' "+ $line" "$line"
		fi
	done >>"$script"
	echo "== $name"
	start=$SECONDS
	checkout=$work/$name
	mkdir "$checkout"
	tar -xf "$work/checkout.tar" -C "$checkout"
	# timeout runs the block in a process group of its own, and passes a
	# TERM on to all of it; the block's own trap stops a Caddy it started.
	(cd "$checkout" && exec timeout 1800 bash "$script") &
	running=$!
	trap 'kill -TERM "$running"; wait "$running"; exit 143' TERM INT
	if ! wait "$running"; then
		echo "FAILED: $name, a block of commands in the documents:"
		cat "$block"
		exit 1
	fi
	trap - TERM INT
	echo "== $name: ok in $((SECONDS - start)) s"
	rm -rf "$checkout"
done
