package ratelimit

import (
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// unmarshalShed reads a shed block:
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
func unmarshalShed(d *caddyfile.Dispenser) (*Shed, error) {
	sh := new(Shed)
	if d.NextArg() {
		sh.Name = d.Val()
		if err := checkShedderName(sh.Name); err != nil {
			return nil, d.Errf("shed: %v", err)
		}
		if d.NextArg() {
			return nil, d.ArgErr()
		}
	}
	given := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		dir := d.Val()
		// fail names the shedder and the directive as written.
		fail := func(err error) error { return d.Errf("shed %q: %s: %v", sh.name(), dir, err) }
		if given[dir] {
			return nil, fail(fmt.Errorf("repeated (want one %s line per shed block)", dir))
		}
		given[dir] = true
		switch dir {
		case "priority":
			if !d.AllArgs(&sh.Priority) {
				return nil, d.ArgErr()
			}
			if err := checkKey(sh.Priority); err != nil {
				return nil, fail(err)
			}

		case "classes":
			sh.Classes = d.RemainingArgs()
			if err := checkShedClasses(sh.Classes); err != nil {
				return nil, fail(err)
			}

		case "capacity":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil {
				return nil, fail(fmt.Errorf("want a number of requests in flight from 1 to %d, got %q", maxLimit, s))
			}
			if err := checkShedCapacity(n); err != nil {
				return nil, fail(err)
			}
			sh.Capacity = n

		case "good", "bad":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, fail(fmt.Errorf("want a utilization above 0 and at most 1, got %q", s))
			}
			if err := checkShedFraction(v); err != nil {
				return nil, fail(err)
			}
			if dir == "good" {
				sh.Good = v
			} else {
				sh.Bad = v
			}

		case "after", "full":
			dur, err := parseDuration(d)
			if err == nil {
				err = checkShedDuration(dur)
			}
			if err != nil {
				return nil, fail(err)
			}
			if dir == "after" {
				sh.After = caddy.Duration(dur)
			} else {
				sh.Full = caddy.Duration(dur)
			}

		case "status":
			code, err := parseStatus(d)
			if err != nil {
				return nil, fail(err)
			}
			sh.Status = code

		case "dry_run":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			sh.DryRun = true

		default:
			return nil, d.Errf("shed %q: unknown subdirective %q (want priority, classes, capacity, good, bad, after, full, status or dry_run)", sh.name(), dir)
		}
	}
	// What no line could check: the fields that are missing, and good
	// against bad.
	if err := sh.validate(); err != nil {
		return nil, d.Errf("shed %q: %v", sh.name(), err)
	}
	return sh, nil
}

// parseStatus reads the one argument of a status directive.
func parseStatus(d *caddyfile.Dispenser) (int, error) {
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	code, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("want an HTTP status from 400 to 599, got %q", s)
	}
	return code, checkStatus(code)
}
