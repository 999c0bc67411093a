package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/d61b427a/caddy-rate-limit/storage"
)

// This file holds what lets a config written for mholt/caddy-ratelimit
// carry over: its handler options (jitter, sweep_interval, log_key,
// disable_metrics), and a refusal that says what to write instead for the
// two it has that this module does not (distributed, storage). Names that
// reach response headers are checked here too.

// migrateToRedis is what the refusal of distributed and storage says.
const migrateToRedis = "want store redis { address ... } instead, which shares exact counters between instances"

// errDistributed and errStorage refuse mholt/caddy-ratelimit's way of
// sharing counts between instances, in one line that says what to write.
var (
	errDistributed = errors.New("distributed: not supported (mholt/caddy-ratelimit's approximate sync through storage); " + migrateToRedis)
	errStorage     = errors.New("storage: not supported (mholt/caddy-ratelimit's sync storage); " + migrateToRedis)
)

// maxNameLen bounds zone (and shedder) names, which reach response headers,
// metrics labels, Redis keys and admin API paths.
const maxNameLen = 128

// checkName accepts a name of 1 to maxNameLen printable ASCII characters
// (0x20 to 0x7E): any of them can be written in an RFC 8941 string, which
// the RateLimit and RateLimit-Policy headers carry the name in, and none
// is a control character that could confuse a log line or a header. It is
// the rule for every name a response may show.
func checkName(name string) error {
	if len(name) > maxNameLen {
		return fmt.Errorf("name: want at most %d characters, got %d", maxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("name: want printable ASCII characters (0x20 to 0x7E), got byte 0x%02x at offset %d", c, i)
		}
	}
	return nil
}

// sfString writes s, which checkName accepted, as an RFC 8941 (Structured
// Field Values) String: in double quotes, with only `\` and `"` escaped by
// a backslash. Go's %q is not that: it escapes other bytes in ways an RFC
// 8941 parser refuses.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == '"' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// provisionName sets up what the zone derives from its name: its header
// form and its metrics series (none with disable_metrics, so the zone
// leaves no series behind, not even at zero). It refuses a name that
// checkName does not accept before anything is labelled with it.
func (z *Zone) provisionName(metricsOff bool) error {
	if err := checkZoneName(z.Name); err != nil {
		return err
	}
	z.sfName = sfString(z.Name)
	if metricsOff {
		for i := range z.results {
			z.results[i] = unexportedCounter()
		}
		z.usage = discardObserver
		return nil
	}
	for i := range z.results {
		z.results[i] = metrics.requests.WithLabelValues(z.Name, resultNames[i])
	}
	z.usage = metrics.periodUsage.WithLabelValues(z.Name)
	return nil
}

// unexportedCounter is a counter no registry collects: what a handler with
// disable_metrics counts into, so that counting stays one atomic add with
// no branch.
func unexportedCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "rate_limit_unexported"})
}

var discardObserver = prometheus.ObserverFunc(func(float64) {})

// provisionOptions refuses what validateOptions refuses, before anything
// is set up, and applies the handler-level options: the store's metrics
// (unless disable_metrics), the memory store's sweep interval and the
// jitter's random source.
func (h *Handler) provisionOptions(store storage.Store) error {
	if err := h.validateOptions(); err != nil {
		return err
	}
	if h.DisableMetrics {
		h.storeErrorsC = unexportedCounter()
	} else {
		h.storeErrorsC = metrics.storeErrors.WithLabelValues(h.storeName)
		if h.storeName != "memory" {
			h.storeLatency = metrics.storeDuration.WithLabelValues(h.storeName)
		}
	}
	if mem, ok := store.(*storage.Memory); ok && h.SweepInterval > 0 {
		mem.SetSweepInterval(time.Duration(h.SweepInterval))
	}
	if h.Jitter > 0 && h.random == nil {
		h.random = rand.Float64
	}
	return nil
}

// validateOptions checks the handler-level options of mholt/caddy-ratelimit
// and how they sit with this module's own.
func (h *Handler) validateOptions() error {
	if present(h.Distributed) {
		return errDistributed
	}
	if present(h.Storage) {
		return errStorage
	}
	if err := checkJitter(h.Jitter); err != nil {
		return fmt.Errorf("jitter: %w", err)
	}
	if err := storage.CheckSweepInterval(time.Duration(h.SweepInterval)); err != nil {
		return fmt.Errorf("sweep_interval: %w", err)
	}
	if h.SweepInterval != 0 {
		if backend := storeBackend(h.StoreRaw); backend != "memory" {
			return fmt.Errorf("sweep_interval: applies to the memory store only; want it removed with store %s, whose keys expire on their own", backend)
		}
	}
	if h.LogKey && h.LogKeys != "" {
		return fmt.Errorf("log_key: want either log_key or log_keys, not both (log_key is log_keys on)")
	}
	return nil
}

// present reports whether a JSON field was given a value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// storeBackend names the store a handler's store config asks for.
func storeBackend(raw json.RawMessage) string {
	var s struct {
		Backend string `json:"backend"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil || s.Backend == "" {
		return "memory"
	}
	return s.Backend
}

func checkJitter(f float64) error {
	if math.IsNaN(f) || f < 0 || f > 1 {
		return fmt.Errorf("want a fraction of the wait from 0 to 1 (0.2 adds up to 20%%), got %v", f)
	}
	return nil
}

// retryAfter is the Retry-After of a request that may next be allowed at
// at: the wait in whole seconds, rounded up, at least 1, plus, with
// jitter, a uniformly random extra of up to that fraction of the wait.
// Only the header moves: the instant the store and the deny cache hold is
// at.
func (h *Handler) retryAfter(at, now time.Time) int64 {
	if h.Jitter == 0 || h.random == nil {
		return retryAfterSeconds(at, now)
	}
	wait := max(at.Sub(now), 0)
	extra := time.Duration(h.random() * h.Jitter * float64(wait))
	return retryAfterSeconds(at.Add(extra), now)
}

// unmarshalOption reads one of mholt/caddy-ratelimit's handler-level
// subdirectives; distributed and storage are refused, with what to write
// instead.
func (h *Handler) unmarshalOption(d *caddyfile.Dispenser) error {
	switch dir := d.Val(); dir {
	case "jitter":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return d.Errf("jitter: want a fraction of the wait from 0 to 1 (0.2 adds up to 20%%), got %q", s)
		}
		if err := checkJitter(f); err != nil {
			return d.Errf("jitter: %v", err)
		}
		h.Jitter = f

	case "sweep_interval":
		dur, err := parseDuration(d)
		if err == nil {
			err = storage.CheckSweepInterval(dur)
		}
		if err == nil && dur == 0 {
			err = fmt.Errorf("want a duration of at least %s, got %s", storage.MinSweepInterval, dur)
		}
		if err != nil {
			return d.Errf("sweep_interval: %v", err)
		}
		h.SweepInterval = caddy.Duration(dur)

	case "log_key", "disable_metrics":
		if d.NextArg() {
			return d.ArgErr()
		}
		if dir == "log_key" {
			h.LogKey = true
		} else {
			h.DisableMetrics = true
		}

	case "distributed":
		return d.Err(errDistributed.Error())

	case "storage":
		return d.Err(errStorage.Error())
	}
	return nil
}
