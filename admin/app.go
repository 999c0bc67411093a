package admin

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/d61b427a/caddy-rate-limit/internal/bodyread"
)

func init() {
	caddy.RegisterModule(App{})
	httpcaddyfile.RegisterGlobalOption("rate_limit", parseGlobalOption)
}

// App holds the rate limiter's settings for the whole Caddy process, as
// opposed to one handler's: the admin API (admin.api.rate_limit) is one
// per process, whatever the configs' handlers, and so is the memory
// that request bodies being read take. In a Caddyfile it is the global
// option
//
//	{
//		rate_limit {
//			admin_changes off
//			body_memory 64MiB
//			body_timeout 10s
//		}
//	}
type App struct {
	// "off" turns off the admin API's routes that change state: a key's
	// reset, per-key limit overrides and zone dials answer 403 Forbidden;
	// the routes that read keep working. Default: "on". A rate_limit
	// handler's admin_changes off does the same.
	AdminChanges string `json:"admin_changes,omitempty"`

	// The most memory, in bytes, that the request bodies rate_limit
	// zones read may take at once in this Caddy process: past it, a
	// request whose body a zone would read is answered 503 Service
	// Unavailable with Retry-After: 1. At least 2 MiB. Default: 64 MiB.
	// A rate_limit handler's own body_memory applies to its requests
	// instead.
	BodyMemory int64 `json:"body_memory,omitempty"`

	// How long a client has to send a body a rate_limit zone reads:
	// past it, the request is answered 408 Request Timeout. At least 1s.
	// Default: 10s. A rate_limit handler's own body_timeout applies to
	// its requests instead.
	BodyTimeout caddy.Duration `json:"body_timeout,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision turns the admin API's changes off, if the app says so, while
// its config runs.
func (a *App) Provision(caddy.Context) error {
	if a.AdminChanges == "off" {
		TurnChangesOff(a, "the global rate_limit option")
	}
	return nil
}

// Validate refuses an admin_changes other than on or off, and a
// body_memory or body_timeout too small.
func (a *App) Validate() error {
	if err := checkOnOff(a.AdminChanges); err != nil {
		return fmt.Errorf("rate_limit: admin_changes: %w", err)
	}
	if a.BodyMemory != 0 {
		if err := bodyread.CheckMemory(a.BodyMemory); err != nil {
			return fmt.Errorf("rate_limit: body_memory: %w", err)
		}
	}
	if a.BodyTimeout != 0 {
		if err := bodyread.CheckTimeout(time.Duration(a.BodyTimeout)); err != nil {
			return fmt.Errorf("rate_limit: body_timeout: %w", err)
		}
	}
	return nil
}

// Start does nothing: the app only holds settings.
func (*App) Start() error { return nil }

// Stop does nothing: the app only holds settings.
func (*App) Stop() error { return nil }

// Cleanup gives back the app's say on the admin API's changes.
func (a *App) Cleanup() error {
	ReleaseChanges(a)
	return nil
}

// parseGlobalOption reads the global option
//
//	rate_limit {
//		admin_changes on|off
//		body_memory <size>
//		body_timeout <duration>
//	}
//
// into the rate_limit app.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("rate_limit: repeated global option (want one rate_limit block)")
	}
	d.Next() // option name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	app := new(App)
	given := make(map[string]bool)
	for d.NextBlock(0) {
		dir := d.Val()
		if given[dir] {
			return nil, d.Errf("rate_limit: %s: repeated (want it once)", dir)
		}
		given[dir] = true
		switch dir {
		case "admin_changes":
			if !d.AllArgs(&app.AdminChanges) {
				return nil, d.ArgErr()
			}
			if err := checkOnOff(app.AdminChanges); err != nil {
				return nil, d.Errf("rate_limit: admin_changes: %v", err)
			}
		case "body_memory":
			var size string
			if !d.AllArgs(&size) {
				return nil, d.ArgErr()
			}
			n, err := bodyread.ParseSize(size)
			if err == nil {
				app.BodyMemory = n
				err = bodyread.CheckMemory(n)
			}
			if err != nil {
				return nil, d.Errf("rate_limit: body_memory: %v", err)
			}
		case "body_timeout":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			t, err := caddy.ParseDuration(v)
			if err != nil {
				err = fmt.Errorf("want a duration such as 10s, got %q", v)
			} else {
				app.BodyTimeout = caddy.Duration(t)
				err = bodyread.CheckTimeout(t)
			}
			if err != nil {
				return nil, d.Errf("rate_limit: body_timeout: %v", err)
			}
		default:
			return nil, d.Errf("rate_limit: unknown global subdirective %q (want admin_changes, body_memory or body_timeout)", dir)
		}
	}
	raw, err := json.Marshal(app)
	if err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "rate_limit", Value: raw}, nil
}

// checkOnOff accepts a switch: on, off, or "" for its default.
func checkOnOff(v string) error {
	switch v {
	case "", "on", "off":
		return nil
	}
	return fmt.Errorf("want on or off, got %q", v)
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
