package ratelimit

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/internal/names"
)

// This file refuses configurations that cannot work, at load: Validate,
// and the checks the Caddyfile parser runs on each line too, so that
// JSON and the Caddyfile are held to the same rules and every error names
// its directive.

// Validate refuses configurations that cannot work, naming the zone and the
// field. The Caddyfile parser calls the same checks as it reads each line,
// so that `caddy adapt` names the file and line as well.
func (h *Handler) Validate() error {
	if err := checkHeaders(h.Headers); err != nil {
		return fmt.Errorf("headers: %w", err)
	}
	if err := checkOnStoreError(h.OnStoreError); err != nil {
		return fmt.Errorf("on_store_error: %w", err)
	}
	if err := checkOnOff(h.LogKeys); err != nil {
		return fmt.Errorf("log_keys: %w", err)
	}
	if err := checkOnOff(h.AdminChanges); err != nil {
		return fmt.Errorf("admin_changes: %w", err)
	}
	if err := h.validateOptions(); err != nil {
		return err
	}
	if err := h.validateBodyLimits(); err != nil {
		return err
	}
	if len(h.Zones) == 0 && h.Shed == nil {
		return errNoZone
	}
	if h.Shed != nil {
		if err := h.Shed.Validate(); err != nil {
			return fmt.Errorf("shed %q: %w", h.Shed.DisplayName(), err)
		}
	}
	seen := make(map[string]bool)
	for _, z := range h.Zones {
		if z == nil {
			return errNullZone
		}
		if seen[z.Name] {
			return fmt.Errorf("zone %q: %w", z.Name, errDuplicateZone)
		}
		seen[z.Name] = true
		if err := z.validate(); err != nil {
			return fmt.Errorf("zone %q: %w", z.Name, err)
		}
	}
	return nil
}

var (
	errNullZone      = errors.New("zones: want a zone object, got null")
	errNoZone        = errors.New("rate_limit: at least one zone or a shed block is required")
	errDuplicateZone = errors.New("duplicate zone name in one rate_limit handler (want one zone block per name)")
)

// validate checks each field of the zone with the check the parser uses
// for it, and the zone as a whole.
func (z *Zone) validate() error {
	if err := checkZoneName(z.Name); err != nil {
		return err
	}
	if len(z.LimitAlternatives) == 0 {
		return errors.New("limit: missing (want a positive integer or a placeholder)")
	}
	for _, l := range z.LimitAlternatives {
		if err := checkLimit(l); err != nil {
			return fmt.Errorf("limit: %w", err)
		}
	}
	for _, k := range z.KeyAlternatives {
		if err := checkKey(k); err != nil {
			return fmt.Errorf("key: %w", err)
		}
	}
	if z.Algorithm != "" {
		if err := checkAlgorithm(z.Algorithm); err != nil {
			return fmt.Errorf("algorithm: %w", err)
		}
	}
	if err := z.validateAlgorithmOptions(); err != nil {
		return err
	}
	for m, c := range z.Cost {
		if err := checkCost(m, c); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
	}
	if err := checkMaxDelay(time.Duration(z.MaxDelay)); err != nil {
		return fmt.Errorf("max_delay: %w", err)
	}
	if err := checkMaxWaiting(z.MaxWaiting); err != nil {
		return fmt.Errorf("max_waiting: %w", err)
	}
	if err := checkPrefix(z.IPv4Prefix, 32); err != nil {
		return fmt.Errorf("ipv4_prefix: %w", err)
	}
	if err := checkPrefix(z.IPv6Prefix, 128); err != nil {
		return fmt.Errorf("ipv6_prefix: %w", err)
	}
	if z.Status != 0 {
		if err := checkStatus(z.Status); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	for _, v := range z.CountStatus {
		if err := checkCountStatus(v); err != nil {
			return fmt.Errorf("count_status: %w", err)
		}
	}
	if z.Ban != 0 {
		if err := checkBan(time.Duration(z.Ban)); err != nil {
			return fmt.Errorf("ban: %w", err)
		}
	}
	if err := z.validateCostFrom(); err != nil {
		return err
	}
	return z.validateCostsFit()
}

// validateCostsFit refuses a cost, or a reserve <n>, that the zone could
// never let pass: more than a gcra zone's burst, or than its limit when
// that is an integer (the first alternative: a template may resolve to
// more). Every such request would be refused.
func (z *Zone) validateCostsFit() error {
	most, what := z.burstOrLimit()
	if most == 0 {
		return nil
	}
	for _, m := range slices.Sorted(maps.Keys(z.Cost)) {
		if c := z.Cost[m]; c > most {
			return fmt.Errorf("cost: a %s request costs more than the %s of %d lets pass at once, so it could never pass (want a cost of at most %d), got %d", m, what, most, most, c)
		}
	}
	if z.Reserve != nil && z.Reserve.Units > most {
		return fmt.Errorf("reserve: more than the %s of %d lets pass at once, so no request could ever pass (want at most %d), got %d", what, most, most, z.Reserve.Units)
	}
	return nil
}

// burstOrLimit is the most the zone lets pass at once, if its config
// says: a gcra zone's burst, or its limit when the first alternative is
// an integer; 0 if it depends on the request. It names which it is.
func (z *Zone) burstOrLimit() (int64, string) {
	if z.Algorithm == algorithms.GCRA && z.Burst > 0 {
		return z.Burst, "burst"
	}
	if len(z.LimitAlternatives) == 0 {
		return 0, ""
	}
	n, err := strconv.ParseInt(z.LimitAlternatives[0], 10, 64)
	if err != nil {
		return 0, ""
	}
	return n, "limit"
}

// validateAlgorithmOptions checks the options that belong to some
// algorithms only: a window for every algorithm but concurrency, burst for
// gcra, hold (or its old name, lease) for concurrency.
func (z *Zone) validateAlgorithmOptions() error {
	alg := z.Algorithm
	if alg == "" {
		alg = algorithms.SlidingTail
	}
	if alg == algorithms.Concurrency {
		// Units in flight are released anyway, and nothing frees up at a
		// known instant for a ban to outlast.
		if len(z.CountStatus) > 0 {
			return errors.New("count_status: not for algorithm concurrency, which releases every request's units when it is done (want a windowed or gcra zone)")
		}
		if z.Ban != 0 {
			return errors.New("ban: not for algorithm concurrency, which limits requests in flight, not a rate to exceed (want a windowed or gcra zone)")
		}
		if z.Window != (Window{}) {
			return fmt.Errorf("window: not used by algorithm concurrency, which limits requests in flight (want no window; hold bounds how long a dead instance's units stay held), got %s", z.Window)
		}
		if z.Hold != 0 && z.Lease != 0 {
			return errors.New("lease: the old name of hold (want hold only, not both)")
		}
		if err := checkHold(time.Duration(z.Hold)); z.Hold != 0 && err != nil {
			return fmt.Errorf("hold: %w", err)
		}
		if err := checkHold(time.Duration(z.Lease)); z.Lease != 0 && err != nil {
			return fmt.Errorf("lease: %w", err)
		}
	} else {
		if z.Window == (Window{}) {
			return errors.New("window: missing (want a duration of at least 1ms, or a calendar period: day, week, month or year)")
		}
		if z.Window.Calendar == "" {
			if err := checkWindow(z.Window.Length); err != nil {
				return fmt.Errorf("window: %w", err)
			}
		}
		if err := checkCalendarWindow(z.Window, alg); err != nil {
			return fmt.Errorf("window: %w", err)
		}
		if z.Hold != 0 {
			return fmt.Errorf("hold: only for algorithm concurrency (want no hold with algorithm %s), got %s", alg, time.Duration(z.Hold))
		}
		if z.Lease != 0 {
			return fmt.Errorf("lease: only for algorithm concurrency (want no lease, the old name of hold, with algorithm %s), got %s", alg, time.Duration(z.Lease))
		}
	}
	if z.Timezone != "" {
		if z.Window.Calendar == "" {
			with := "with window " + z.Window.String()
			if z.Window == (Window{}) {
				with = "without a window"
			}
			return fmt.Errorf("timezone: %w (want no timezone, or window day, week, month or year), got %s %s", errTimezoneWithoutCalendar, z.Timezone, with)
		}
		if _, err := checkTimezone(z.Timezone); err != nil {
			return fmt.Errorf("timezone: %w", err)
		}
	}
	if z.Buckets != 0 {
		if alg != algorithms.SlidingWindow {
			return fmt.Errorf("buckets: only for algorithm sliding_window (want no buckets with algorithm %s), got %d", alg, z.Buckets)
		}
		if err := checkBuckets(z.Buckets); err != nil {
			return fmt.Errorf("buckets: %w", err)
		}
		if ms := z.Window.Length.Milliseconds(); ms < int64(z.Buckets) {
			return fmt.Errorf("buckets: want at most one bucket per millisecond of the window (%s), got %d", z.Window, z.Buckets)
		}
	}
	if alg == algorithms.SlidingWindow && z.Buckets == 0 && z.Window.Length < algorithms.DefaultBuckets*time.Millisecond {
		return fmt.Errorf("window: want at least %dms for the default %d buckets of sliding_window, got %s", algorithms.DefaultBuckets, algorithms.DefaultBuckets, z.Window)
	}
	if z.Burst != 0 {
		if alg != algorithms.GCRA {
			return fmt.Errorf("burst: only for algorithm gcra (want no burst with algorithm %s), got %d", alg, z.Burst)
		}
		if err := checkBurst(z.Burst); err != nil {
			return fmt.Errorf("burst: %w", err)
		}
		// With a limit of 1 the bucket is deepest: burst windows.
		if err := (algorithms.Rate{Units: 1, Window: z.Window.Length, Burst: z.Burst}).Validate(); err != nil {
			return fmt.Errorf("burst: want burst × window at most 2^50 ms, got %d × %s", z.Burst, z.Window)
		}
	}
	return nil
}

// The checks below hold one rule each. Their errors say what was expected
// and what was given, without the field's name, which the caller adds:
// the JSON field in Validate, the directive as written in the Caddyfile.

func checkHeaders(v string) error {
	switch v {
	case "", headersXRateLimit, headersIETF, headersBoth, headersOff:
		return nil
	}
	return fmt.Errorf("want x-ratelimit, ietf, both or off, got %q", v)
}

func checkOnStoreError(v string) error {
	switch v {
	case "", "allow", "deny", "local":
		return nil
	}
	return fmt.Errorf("want allow, deny or local, got %q", v)
}

// checkOnOff accepts a switch: on, off, or "" for its default.
func checkOnOff(v string) error {
	switch v {
	case "", "on", "off":
		return nil
	}
	return fmt.Errorf("want on or off, got %q", v)
}

// checkZoneName accepts a zone's name. A name is one segment of the admin
// API's paths (/rate_limit/zones/<zone>/...), which the status page and
// the command fetch with the name escaped; "." and ".." cannot be, since
// browsers and URL parsers take them, escaped or not, for the directory
// and its parent and drop them from the path.
func checkZoneName(name string) error {
	if name == "" {
		return errors.New("zone: a name is required")
	}
	if dotSegment(name) {
		return fmt.Errorf("name: want a name other than . and .. (the admin API and the status page put a zone's name in a URL path, which drops them), got %q", name)
	}
	return names.Check(name)
}

// dotSegment reports whether name is a segment a URL path drops.
func dotSegment(name string) bool {
	return name == "." || name == ".."
}

// checkLimit accepts a template, which is resolved per request, a
// positive integer, or a positive dollar amount, "$50", for a zone priced
// in money (which checkLimitMoney holds the zone to).
func checkLimit(l string) error {
	if strings.Contains(l, "{") {
		return checkBodyPlaceholders(l)
	}
	if strings.HasPrefix(l, "$") {
		if n, err := money.Parse(l); err != nil || n == 0 {
			return fmt.Errorf("want a positive dollar amount such as $50 or $0.25, with at most 12 decimals, up to %s, got %q", money.MaxDollars, l)
		}
		return nil
	}
	n, err := strconv.ParseInt(l, 10, 64)
	if err != nil || n <= 0 || n > maxLimit {
		return fmt.Errorf("want an integer from 1 to %d or a placeholder, got %q", maxLimit, l)
	}
	return nil
}

func checkKey(k string) error {
	if strings.TrimSpace(k) == "" {
		return errors.New("want a template, got an empty one")
	}
	return checkBodyPlaceholders(k)
}

func checkWindow(d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("want a duration of at least 1ms, got %s", d)
	}
	return nil
}

func checkAlgorithm(a algorithms.Algorithm) error {
	if !a.Valid() {
		return fmt.Errorf("want sliding_tail, fixed_window, sliding_window, gcra or concurrency, got %q", a)
	}
	return nil
}

func checkBuckets(n int) error {
	if n < algorithms.MinBuckets || n > algorithms.MaxBuckets {
		return fmt.Errorf("want an integer from %d to %d, got %d", algorithms.MinBuckets, algorithms.MaxBuckets, n)
	}
	return nil
}

func checkBurst(n int64) error {
	if n < 1 || n > maxLimit {
		return fmt.Errorf("want an integer from 1 to %d, got %d", maxLimit, n)
	}
	return nil
}

func checkHold(d time.Duration) error {
	if d < time.Second {
		return fmt.Errorf("want a duration of at least 1s, got %s", d)
	}
	return nil
}

func checkBan(d time.Duration) error {
	if d < time.Second {
		return fmt.Errorf("want a duration of at least 1s, got %s", d)
	}
	return nil
}

func checkCost(method string, c int64) error {
	if method != "*" && methodIndex(method) == methodOther {
		return fmt.Errorf("want an HTTP method such as GET or POST, or *, got unknown HTTP method %q", method)
	}
	if c < 0 || c > maxLimit {
		return fmt.Errorf("want a %s cost from 0 to %d, got %d", method, maxLimit, c)
	}
	return nil
}

func checkMaxDelay(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("want a duration of 0 or more, got %s", d)
	}
	return nil
}

func checkMaxWaiting(n int) error {
	if n < 0 {
		return fmt.Errorf("want 0 or more requests, got %d", n)
	}
	return nil
}

// checkStatus accepts a client or server error status.
func checkStatus(code int) error {
	if code < 400 || code > 599 {
		return fmt.Errorf("want an HTTP status from 400 to 599, got %d", code)
	}
	return nil
}

func checkJitter(f float64) error {
	if math.IsNaN(f) || f < 0 || f > 1 {
		return fmt.Errorf("want a fraction of the wait from 0 to 1 (0.2 adds up to 20%%), got %v", f)
	}
	return nil
}

func checkPrefix(bits, most int) error {
	if bits < 0 || bits > most {
		return fmt.Errorf("want a prefix length from 0 to %d bits, got %d", most, bits)
	}
	return nil
}

// checkCalendarWindow refuses a calendar period with an algorithm that
// does not count in windows: their arithmetic is of a rate (gcra), of a
// window's equal sub-windows (sliding_window) or of units in flight
// (concurrency).
func checkCalendarWindow(w Window, alg algorithms.Algorithm) error {
	if w.Calendar != "" && !alg.Windowed() {
		return fmt.Errorf("a calendar period is only for algorithm fixed_window or sliding_tail (want one of those, or a duration with algorithm %s), got %s with algorithm %s", alg, w.Calendar, alg)
	}
	return nil
}

// checkTimezone refuses a time zone that is not an IANA name the
// built-in time zone database knows. Local is refused too: it is
// whatever the machine is set to, and instances that share a store
// must cut the same periods.
func checkTimezone(name string) (*time.Location, error) {
	if name == "" || strings.EqualFold(name, "Local") {
		return nil, fmt.Errorf("want an IANA time zone name such as America/New_York or UTC, got %q", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("want an IANA time zone name such as America/New_York or UTC, got %q", name)
	}
	return loc, nil
}

// errTimezoneWithoutCalendar refuses a timezone for a window of a
// length: such windows are cut on the Unix epoch, the same instants in
// every time zone, so a timezone would say nothing.
var errTimezoneWithoutCalendar = errors.New("only for a calendar window (day, week, month or year), which starts at local midnight; a window of a length is cut on the Unix epoch, the same in every time zone")

// checkCountStatus accepts a status code from 100 to 599, or a class of
// them from 1xx to 5xx.
func checkCountStatus(v string) error {
	if _, err := parseStatusSpec(v); err != nil {
		return err
	}
	return nil
}
