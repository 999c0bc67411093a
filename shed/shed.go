// Package shed is a worker utilization load shedder (Stripe's second load
// shedder) for the rate_limit handler: when the requests in flight through
// the handlers after it stay near capacity, it drops the least important
// requests first, slowly and predictably, so that the most important keep
// working.
//
// The handler asks it about each request before any zone (Check), and
// counts the requests it passes on while the next handler has them (Enter
// and Leave). Everything else is here: the shed block's config and
// Caddyfile syntax, the formula that moves the shedding amount, the
// sampler shared by the shedders of one name, their metrics, and what the
// admin API shows of them (List).
package shed

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/d61b427a/caddy-rate-limit/internal/names"
)

// Shed is a worker utilization load shedder. It measures utilization u,
// the average over the last second of the requests in flight through the
// handler's next on this instance divided by capacity, and once a second
// moves the shedding amount A:
//
//	f = u/good - 1        if u < good
//	    0                 if good <= u < bad
//	    (u-bad)/(1-bad)   if u >= bad
//	A += clamp(f, -1, 1) * dt / full,   A clamped to [-after/full, 1]
//
// A starts at -after/full. Counting the classes that may be shed from the
// least important (j = 0), a request of class j is dropped with
// probability clamp(A*k - j, 0, 1), where k is the number of classes less
// one: the least important class goes first, the next once the first is
// fully shed, and at A = 1 all but the first class are shed.
//
// Shedders with the same name share their in-flight count and amount,
// across the handlers of this process and across config reloads.
type Shed struct {
	// The shedder's name; handlers whose shedders have the same name share
	// one. Printable ASCII. Default: "default".
	Name string `json:"name,omitempty"`

	// A template (Caddy placeholders and literal text) whose value is the
	// request's class, such as {http.request.header.X-Priority} or the
	// output of a `map`. A request whose priority is empty, does not
	// resolve or is not one of the classes is in the last class. Without
	// a priority every request is in the last class. It is resolved only
	// while the shedder sheds (A > 0).
	Priority string `json:"priority,omitempty"`

	// The classes, most important first. The first is never shed.
	// Required: at least one.
	Classes []string `json:"classes"`

	// How many requests in flight through this handler mean that the app
	// is fully busy (u = 1). Required.
	Capacity int `json:"capacity"`

	// Below this utilization, shedding eases off. Default: 0.7.
	Good float64 `json:"good,omitempty"`

	// At or above this utilization, shedding grows. Default: 0.8.
	Bad float64 `json:"bad,omitempty"`

	// At full utilization, the time before the first request is shed.
	// Default: 28s.
	After caddy.Duration `json:"after,omitempty"`

	// At full utilization, the time from the first shed request to
	// shedding all but the first class. Default: 2m.
	Full caddy.Duration `json:"full,omitempty"`

	// The status shed requests are answered with (4xx or 5xx). Default:
	// 503.
	Status int `json:"status,omitempty"`

	// Count and log what would be shed, and shed nothing.
	DryRun bool `json:"dry_run,omitempty"`

	// state is the shedder shared by every Shed of this name.
	state *shedder
	// leftState tells that Cleanup let go of state. state stays set, so
	// that requests still running in a config being unloaded count down
	// what they counted up.
	leftState bool
	// classIndex maps a class name to its place in Classes.
	classIndex map[string]int
	// shedTotal is each class's series of caddy_http_rate_limit_shed_total.
	shedTotal []prometheus.Counter
	// shedErrs are the errors that Check returns for shed requests, by
	// class, made once.
	shedErrs []error
	// random draws a number in [0, 1) for a drop chance strictly between
	// 0 and 1: the one source of randomness, replaced in tests.
	random func() float64
	logger *zap.Logger
}

// Defaults of the shed block.
const (
	DefaultName   = "default"
	DefaultGood   = 0.7
	DefaultBad    = 0.8
	DefaultAfter  = 28 * time.Second
	DefaultFull   = 2 * time.Minute
	DefaultStatus = http.StatusServiceUnavailable
)

// DisplayName is the shedder's name, its default when none is given.
func (sh *Shed) DisplayName() string {
	if sh.Name == "" {
		return DefaultName
	}
	return sh.Name
}

// params are the settings that move the amount, defaults applied.
func (sh *Shed) params() params {
	p := params{good: sh.Good, bad: sh.Bad, after: time.Duration(sh.After), full: time.Duration(sh.Full)}
	if p.good == 0 {
		p.good = DefaultGood
	}
	if p.bad == 0 {
		p.bad = DefaultBad
	}
	if p.after == 0 {
		p.after = DefaultAfter
	}
	if p.full == 0 {
		p.full = DefaultFull
	}
	return p
}

// Validate checks each field with the check the Caddyfile parser uses for
// it. A zero field is its default (JSON cannot tell it from a missing one),
// except capacity and classes, which are required.
func (sh *Shed) Validate() error {
	if sh.Name != "" {
		if err := checkName(sh.Name); err != nil {
			return err
		}
	}
	if sh.Priority != "" {
		if err := checkPriority(sh.Priority); err != nil {
			return fmt.Errorf("priority: %w", err)
		}
	}
	if len(sh.Classes) == 0 {
		return errors.New("classes: missing (want at least one class, most important first)")
	}
	if err := checkClasses(sh.Classes); err != nil {
		return fmt.Errorf("classes: %w", err)
	}
	if sh.Capacity == 0 {
		return errors.New("capacity: missing (want a positive number of requests in flight)")
	}
	if err := checkCapacity(sh.Capacity); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	if sh.Good != 0 {
		if err := checkFraction(sh.Good); err != nil {
			return fmt.Errorf("good: %w", err)
		}
	}
	if sh.Bad != 0 {
		if err := checkFraction(sh.Bad); err != nil {
			return fmt.Errorf("bad: %w", err)
		}
	}
	p := sh.params()
	if err := checkGood(p.good, p.bad); err != nil {
		return fmt.Errorf("good: %w", err)
	}
	if sh.After != 0 {
		if err := checkDuration(time.Duration(sh.After)); err != nil {
			return fmt.Errorf("after: %w", err)
		}
	}
	if sh.Full != 0 {
		if err := checkDuration(time.Duration(sh.Full)); err != nil {
			return fmt.Errorf("full: %w", err)
		}
	}
	if sh.Status != 0 {
		if err := checkStatus(sh.Status); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	return nil
}

// The checks of the shed block's fields, one rule each; the caller adds
// the field's name.

// maxCapacity bounds capacity, as the handler bounds limits.
const maxCapacity = 1<<31 - 1

// checkName applies the rule for every name a response may show: the
// shedder's name is a metric label, a log field and part of an admin API
// answer.
func checkName(name string) error {
	if name == "" {
		return errors.New("name: want a name of printable ASCII, got an empty one")
	}
	if err := names.Check(name); err != nil {
		return fmt.Errorf("%w, in %q", err, name)
	}
	return nil
}

func checkPriority(p string) error {
	if strings.TrimSpace(p) == "" {
		return errors.New("want a template, got an empty one")
	}
	return nil
}

func checkClasses(classes []string) error {
	if len(classes) == 0 {
		return errors.New("want at least one class, most important first, got none")
	}
	for i, c := range classes {
		if c == "" {
			return errors.New("want non-empty class names, got an empty one")
		}
		if slices.Contains(classes[:i], c) {
			return fmt.Errorf("want each class once, got %q repeated", c)
		}
	}
	return nil
}

func checkCapacity(n int) error {
	if n <= 0 || n > maxCapacity {
		return fmt.Errorf("want a number of requests in flight from 1 to %d, got %d", maxCapacity, n)
	}
	return nil
}

// checkFraction accepts a utilization in (0, 1], for good and bad.
func checkFraction(v float64) error {
	if !(v > 0 && v <= 1) {
		return fmt.Errorf("want a utilization above 0 and at most 1, got %g", v)
	}
	return nil
}

// checkGood accepts a good below bad.
func checkGood(good, bad float64) error {
	if good >= bad {
		return fmt.Errorf("want less than bad (%g), got %g", bad, good)
	}
	return nil
}

// checkDuration accepts a positive duration, for after and full.
func checkDuration(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("want a positive duration, got %s", d)
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

// Provision attaches sh to the shedder of its name, starting it if no
// config runs it yet, and registers the shedders' metrics with the
// config's registry. Caddy validates only after provisioning, so the
// settings are checked here first. logger is the handler's.
func (sh *Shed) Provision(ctx caddy.Context, logger *zap.Logger) error {
	if err := sh.Validate(); err != nil {
		return err
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	name := sh.DisplayName()
	sh.logger = logger
	sh.classIndex = make(map[string]int, len(sh.Classes))
	sh.shedTotal = make([]prometheus.Counter, len(sh.Classes))
	sh.shedErrs = make([]error, len(sh.Classes))
	for i, c := range sh.Classes {
		sh.classIndex[c] = i
		sh.shedTotal[i] = metrics.total.WithLabelValues(name, c)
		sh.shedErrs[i] = fmt.Errorf("load shed by shedder %q: class %q", name, c)
	}
	if sh.Status == 0 {
		sh.Status = DefaultStatus
	}
	if sh.random == nil {
		sh.random = rand.Float64
	}
	val, _, err := shedders.LoadOrNew(name, func() (caddy.Destructor, error) {
		s := newShedder(sh, time.Now())
		go s.run()
		return s, nil
	})
	if err != nil {
		return err
	}
	sh.state = val.(*shedder)
	sh.state.addUser(sh)
	return nil
}

// Cleanup lets go of the shedder; the last user stops its sampler. A
// second call does nothing.
func (sh *Shed) Cleanup() error {
	if sh.state == nil || sh.leftState {
		return nil
	}
	sh.leftState = true
	sh.state.removeUser(sh)
	_, err := shedders.Delete(sh.DisplayName())
	return err
}

// Check decides whether to shed the request, before any zone counts it.
// With the amount at or below 0 it costs one atomic read, and the
// priority is not even resolved; otherwise the priority template is
// resolved with repl. It returns nil for a request that goes on, and for
// a shed request the error the handler answers with Status and
// Retry-After: 1 (the amount moves once a second). In dry run it counts
// what it would shed and returns nil.
func (sh *Shed) Check(repl *caddy.Replacer) error {
	a := sh.state.load()
	if a <= 0 {
		return nil
	}
	i := sh.class(repl)
	p := dropChance(a, len(sh.Classes), i)
	if p <= 0 || p < 1 && sh.random() >= p {
		return nil
	}
	sh.shedTotal[i].Inc()
	sh.state.shed.Add(1)
	if sh.DryRun {
		return nil
	}
	return sh.shedErrs[i]
}

// class returns the index of the request's class: the class its priority
// names, or the last. A priority resolves only if every placeholder in it
// is known and non-empty.
func (sh *Shed) class(repl *caddy.Replacer) int {
	last := len(sh.Classes) - 1
	if sh.Priority == "" {
		return last
	}
	p, err := repl.ReplaceOrErr(sh.Priority, true, true)
	if err != nil {
		return last
	}
	if i, ok := sh.classIndex[strings.TrimSpace(p)]; ok {
		return i
	}
	return last
}

// Enter counts a request in flight through the handler's next: one atomic
// add. Leave, when next returns, counts it out.
func (sh *Shed) Enter() { sh.state.inFlight.Add(1) }

// Leave counts out a request that Enter counted.
func (sh *Shed) Leave() { sh.state.inFlight.Add(-1) }
