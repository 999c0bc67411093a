// Command caddy is Caddy with the rate_limit module linked in, exactly as
// `xcaddy build --with github.com/d61b427a/caddy-rate-limit` would generate it,
// so the project can be built and run with nothing but Go installed.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// plug in Caddy modules here
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/d61b427a/caddy-rate-limit"
)

func main() {
	caddycmd.Main()
}
