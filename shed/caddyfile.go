package shed

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile reads a shed block, the dispenser being on its name:
//
//	shed [<name>] {
//		priority <template>
//		classes <class> [<class>...]
//		capacity <n>
//		good <utilization>
//		bad <utilization>
//		after <duration>
//		full <duration>
//		status <code>
//		dry_run
//	}
//
// Each value is checked as its line is read, with the check Validate uses;
// every subdirective may be given once.
func (sh *Shed) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		sh.Name = d.Val()
		if err := checkName(sh.Name); err != nil {
			return d.Errf("shed: %v", err)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	given := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		dir := d.Val()
		// fail names the shedder and the directive as written.
		fail := func(err error) error { return d.Errf("shed %q: %s: %v", sh.DisplayName(), dir, err) }
		if given[dir] {
			return fail(fmt.Errorf("repeated (want one %s line per shed block)", dir))
		}
		given[dir] = true
		switch dir {
		case "priority":
			if !d.AllArgs(&sh.Priority) {
				return d.ArgErr()
			}
			if err := checkPriority(sh.Priority); err != nil {
				return fail(err)
			}

		case "classes":
			sh.Classes = d.RemainingArgs()
			if err := checkClasses(sh.Classes); err != nil {
				return fail(err)
			}

		case "capacity":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return fail(fmt.Errorf("want a number of requests in flight from 1 to %d, got %q", maxCapacity, s))
			}
			if err := checkCapacity(n); err != nil {
				return fail(err)
			}
			sh.Capacity = n

		case "good", "bad":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fail(fmt.Errorf("want a utilization above 0 and at most 1, got %q", s))
			}
			if err := checkFraction(v); err != nil {
				return fail(err)
			}
			if dir == "good" {
				sh.Good = v
			} else {
				sh.Bad = v
			}

		case "after", "full":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil {
				return fail(fmt.Errorf("want a duration such as 500ms or 1m, got %q", s))
			}
			if err := checkDuration(dur); err != nil {
				return fail(err)
			}
			if dir == "after" {
				sh.After = caddy.Duration(dur)
			} else {
				sh.Full = caddy.Duration(dur)
			}

		case "status":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			code, err := strconv.Atoi(s)
			if err != nil {
				return fail(fmt.Errorf("want an HTTP status from 400 to 599, got %q", s))
			}
			if err := checkStatus(code); err != nil {
				return fail(err)
			}
			sh.Status = code

		case "dry_run":
			if d.NextArg() {
				return d.ArgErr()
			}
			sh.DryRun = true

		default:
			return d.Errf("shed %q: unknown subdirective %q (want priority, classes, capacity, good, bad, after, full, status or dry_run)", sh.DisplayName(), dir)
		}
	}
	// What no line could check: the fields that are missing, and good
	// against bad.
	if err := sh.Validate(); err != nil {
		return d.Errf("shed %q: %v", sh.DisplayName(), err)
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Shed)(nil)
