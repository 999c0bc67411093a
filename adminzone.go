package ratelimit

import (
	"context"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/d61b427a/caddy-rate-limit/admin"
	"github.com/d61b427a/caddy-rate-limit/algorithms"
	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// A zone is registered with the admin package while its handler runs,
// which shows it and acts on it through these methods: the admin API's
// routes, the status page and the caddy rate-limit command.

// Info is the zone's config as the admin API's zone list shows it.
func (z *Zone) Info() admin.ZoneInfo {
	info := admin.ZoneInfo{Name: z.Name, Algorithm: z.Algorithm, Burst: z.Burst, Buckets: z.Buckets,
		Key: z.keySpaces(), Limit: z.LimitAlternatives, Store: z.storeName, DryRun: z.DryRun, Units: z.meter.on}
	if z.meter.prices != nil {
		info.Unit = money.Unit
	}
	if z.Algorithm == algorithms.Concurrency {
		info.Hold = z.hold().String()
	} else {
		info.Window = z.Window.String()
	}
	if z.calendar != nil {
		info.Timezone = z.calendar.Location().String()
		info.PeriodEnds = time.UnixMilli(z.calendar.At(time.Now().UnixMilli()).End)
	}
	return info
}

// keySpaces are the alternatives of the zone's key, each a key space of
// its own (see keys.go), and the client's address it falls back to, last
// unless it is an alternative.
func (z *Zone) keySpaces() []string {
	out := make([]string, 0, len(z.keys)+1)
	for _, t := range z.keys {
		if !slices.Contains(out, t.text) {
			out = append(out, t.text)
		}
	}
	if !slices.Contains(out, clientIPTemplate) {
		out = append(out, clientIPTemplate)
	}
	return out
}

// AlternativesOf returns the alternatives of the zone's key that could
// have given key, a value bounded by storage.BoundKey: a template's
// literal text must be in the value where the template has it, each
// placeholder standing for some text; the client's address is an IP
// address or network; a long value that the bound hashed could come from
// any placeholder. So a value a prefix tells apart (key:customer-42 from
// key:{header.X-Api-Key} ip:{client_ip}) names its alternative, and an
// API key that is no address never needs one named.
func (z *Zone) AlternativesOf(key string) []string {
	var out []string
	for _, alt := range z.keySpaces() {
		if couldGive(alt, key) {
			out = append(out, alt)
		}
	}
	return out
}

// couldGive reports whether the key template alt could give key, a
// bounded value.
func couldGive(alt, key string) bool {
	if alt == clientIPTemplate {
		_, errAddr := netip.ParseAddr(key)
		_, errPrefix := netip.ParsePrefix(key)
		return errAddr == nil || errPrefix == nil
	}
	if hashedForm.MatchString(key) {
		return strings.Contains(alt, "{") || storage.BoundKey(alt) == key
	}
	var pattern strings.Builder
	pattern.WriteString("^")
	last := 0
	for _, p := range placeholderPattern.FindAllStringIndex(alt, -1) {
		pattern.WriteString(regexp.QuoteMeta(alt[last:p[0]]) + "(?s:.+)")
		last = p[1]
	}
	pattern.WriteString(regexp.QuoteMeta(alt[last:]) + "$")
	return regexp.MustCompile(pattern.String()).MatchString(key)
}

// hashedForm is a value storage.BoundKey hashed.
var hashedForm = regexp.MustCompile(`^#[0-9a-f]{32}$`)

// StoredKey is the key the zone's store keeps for key, a value bounded
// by storage.BoundKey, from the alternative from of the zone's key.
func (z *Zone) StoredKey(key, from string) string {
	t := template{tag: spaceTag(from), bare: from == clientIPTemplate}
	return t.tagKey(key)
}

// Admin is the admin side of the zone's store (dials, overrides), nil if
// the store has none.
func (z *Zone) Admin() storage.Admin {
	return z.admin
}

// KeyInfo reads the state of a stored key from the zone's store, which
// has an admin side, and tells what counts against the limit now.
func (z *Zone) KeyInfo(ctx context.Context, stored string) (admin.KeyInfo, error) {
	st, err := z.admin.KeyState(ctx, z.Name, stored, z.rate(maxLimit))
	if err != nil {
		return admin.KeyInfo{}, err
	}
	key, from := keyFrom(stored)
	// Decide for a request of no cost against no limit reports what
	// counts now, without taking anything. A GCRA bucket is measured
	// against the limit the key last took with, kept with its
	// TAT: Used is then the units its bucket lacks, Reset when it is
	// full. A concurrency key's Used is the units in flight.
	rate := z.rate(maxLimit)
	if z.Algorithm == algorithms.GCRA {
		rate = algorithms.Rate{Units: max(st.Counts.TATLimit(), 1), Window: z.period, Burst: z.Burst}
	}
	if z.Algorithm == algorithms.SlidingWindow {
		// Used is the sum of the ring's sub-windows; Current the
		// current sub-window's count, Previous the other n's.
		d, ring := algorithms.DecideRing(st.Ring, time.Now(), rate, 0)
		current := ring.Counts[d.Window%int64(ring.Buckets+1)]
		info := admin.KeyInfo{Zone: z.Name, Key: key, From: from, Hash: z.hash(stored), Used: d.Used, Current: current, Previous: d.Used - current,
			Reset: d.Reset, Override: st.Override, BanEnds: st.BanEnds}
		info.Debt, info.Reserved = z.debt(st, d.Used), z.reserved(st)
		return info, nil
	}
	now := time.Now()
	d, rolled := algorithms.Decide(z.Algorithm, st.Counts, now, rate, 0)
	info := admin.KeyInfo{Zone: z.Name, Key: key, From: from, Hash: z.hash(stored), Used: d.Used, Reset: d.Reset, Override: st.Override, BanEnds: st.BanEnds,
		Reserved: z.reserved(st)}
	if z.Algorithm.Windowed() {
		c := rolled.Windows()
		info.Current, info.Previous, info.PreviousWeighted = c.Current, c.Previous, d.Used-c.Current
		info.Debt = z.debt(st, d.Used)
	}
	if z.Algorithm == algorithms.GCRA && z.meter.on {
		// A bucket's Used stops at its burst; its debt is how far its
		// TAT (Reset, for no cost) stands past a full bucket's: the
		// units that lack beyond the burst.
		w := z.period.Milliseconds()
		lacking := (max(d.Reset.Sub(now).Milliseconds(), 0)*rate.Units + w - 1) / w
		debt := max(lacking-rate.BurstFor(rate.Units), 0)
		info.Debt = &debt
	}
	return info, nil
}

// debt returns, for a cost_from zone, the units used stands past the
// limit of the key whose state is st, or nil if the zone has no
// cost_from or the limit depends on a request.
func (z *Zone) debt(st storage.KeyState, used int64) *int64 {
	if !z.meter.on {
		return nil
	}
	limit, ok := z.keyLimit(st)
	if !ok {
		return nil
	}
	debt := max(used-limit, 0)
	return &debt
}

// reserved returns, for a cost_from zone, the units reserved by the
// key's requests still in flight, as its store keeps them (see
// storage.KeyState.InFlight), or nil if the zone has no cost_from.
func (z *Zone) reserved(st storage.KeyState) *int64 {
	if !z.meter.on {
		return nil
	}
	return &st.InFlight
}

// keyLimit returns the limit the key whose state is st has now, if it
// does not depend on a request: its override, else the zone dial's
// limit, else the zone's first limit when it is a number.
func (z *Zone) keyLimit(st storage.KeyState) (int64, bool) {
	now := time.Now()
	if o := st.Override; o != nil && o.Active(now) {
		return o.Limit, true
	}
	if d, ok := z.admin.ZoneDial(z.Name); ok && d.Limit > 0 && d.Active(now) {
		return d.Limit, true
	}
	if len(z.limits) > 0 && !z.limits[0].dynamic {
		return z.limits[0].number, true
	}
	return 0, false
}

// Top returns the zone's n heaviest keys over about the last minute, as
// stored, with the alternative each came from, and the most any count
// may be overstated. A cost_from zone counts units, not requests.
func (z *Zone) Top(n int) ([]admin.TopKey, int64) {
	keys, bound := z.top.Top(n)
	for i := range keys {
		_, keys[i].From = keyFrom(keys[i].Key)
		if z.meter.on {
			keys[i].Units, keys[i].Requests = keys[i].Requests, 0
		}
	}
	return keys, bound
}

// ShownKey is a stored key as the zone shows it: its value under
// log_keys on, else its hash.
func (z *Zone) ShownKey(stored string) string {
	return shownKey(stored, z.showKeys)
}

// Interface guard
var _ admin.Zone = (*Zone)(nil)
