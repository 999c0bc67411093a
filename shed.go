package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Shed is a worker utilization load shedder (Stripe's second load
// shedder): when the requests in flight through the handler's next on this
// instance stay near capacity, it drops the least important requests first,
// slowly and predictably, so that the most important keep working. It
// measures utilization u, the average over the last second of the requests
// in flight divided by capacity, and once a second moves the shedding
// amount A:
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
	// released tells that Cleanup let go of state. state stays set, so
	// that requests still running in a config being unloaded count down
	// what they counted up.
	released bool
	priority template
	// classIndex maps a class name to its place in Classes.
	classIndex map[string]int
	// shedTotal is each class's series of caddy_http_rate_limit_shed_total.
	shedTotal []prometheus.Counter
	// shedErrs are the handler errors shed requests return, by class,
	// made once.
	shedErrs []error
	// random draws a number in [0, 1) for a drop chance strictly between
	// 0 and 1: the one source of randomness, replaced in tests.
	random func() float64
	logger *zap.Logger
}

// Defaults of the shed block.
const (
	DefaultShedName   = "default"
	DefaultShedGood   = 0.7
	DefaultShedBad    = 0.8
	DefaultShedAfter  = 28 * time.Second
	DefaultShedFull   = 2 * time.Minute
	DefaultShedStatus = http.StatusServiceUnavailable
)

// How often a shedder samples its requests in flight, and how often it
// moves its amount: the average of the samples since the last move is the
// utilization.
const (
	shedSampleEvery = 50 * time.Millisecond
	shedUpdateEvery = time.Second
)

// name is the shedder's name, its default when none is given.
func (sh *Shed) name() string {
	if sh.Name == "" {
		return DefaultShedName
	}
	return sh.Name
}

// params are the settings that move the amount, defaults applied.
func (sh *Shed) params() shedParams {
	p := shedParams{good: sh.Good, bad: sh.Bad, after: time.Duration(sh.After), full: time.Duration(sh.Full)}
	if p.good == 0 {
		p.good = DefaultShedGood
	}
	if p.bad == 0 {
		p.bad = DefaultShedBad
	}
	if p.after == 0 {
		p.after = DefaultShedAfter
	}
	if p.full == 0 {
		p.full = DefaultShedFull
	}
	return p
}

// validate checks each field with the check the Caddyfile parser uses for
// it. A zero field is its default (JSON cannot tell it from a missing one),
// except capacity and classes, which are required.
func (sh *Shed) validate() error {
	if sh.Name != "" {
		if err := checkShedderName(sh.Name); err != nil {
			return err
		}
	}
	if sh.Priority != "" {
		if err := checkKey(sh.Priority); err != nil {
			return fmt.Errorf("priority: %w", err)
		}
	}
	if len(sh.Classes) == 0 {
		return errors.New("classes: missing (want at least one class, most important first)")
	}
	if err := checkShedClasses(sh.Classes); err != nil {
		return fmt.Errorf("classes: %w", err)
	}
	if sh.Capacity == 0 {
		return errors.New("capacity: missing (want a positive number of requests in flight)")
	}
	if err := checkShedCapacity(sh.Capacity); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	if sh.Good != 0 {
		if err := checkShedFraction(sh.Good); err != nil {
			return fmt.Errorf("good: %w", err)
		}
	}
	if sh.Bad != 0 {
		if err := checkShedFraction(sh.Bad); err != nil {
			return fmt.Errorf("bad: %w", err)
		}
	}
	p := sh.params()
	if err := checkShedGood(p.good, p.bad); err != nil {
		return fmt.Errorf("good: %w", err)
	}
	if sh.After != 0 {
		if err := checkShedDuration(time.Duration(sh.After)); err != nil {
			return fmt.Errorf("after: %w", err)
		}
	}
	if sh.Full != 0 {
		if err := checkShedDuration(time.Duration(sh.Full)); err != nil {
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

// The checks of the shed block's fields, one rule each, as in module.go:
// the caller adds the field's name.

// checkShedderName applies the rule for every name a response may show
// (checkName): the shedder's name is a metric label, a log field and part
// of an admin API answer.
func checkShedderName(name string) error {
	if name == "" {
		return errors.New("name: want a name of printable ASCII, got an empty one")
	}
	if err := checkName(name); err != nil {
		return fmt.Errorf("%w, in %q", err, name)
	}
	return nil
}

func checkShedClasses(classes []string) error {
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

func checkShedCapacity(n int) error {
	if n <= 0 || n > maxLimit {
		return fmt.Errorf("want a number of requests in flight from 1 to %d, got %d", maxLimit, n)
	}
	return nil
}

// checkShedFraction accepts a utilization in (0, 1], for good and bad.
func checkShedFraction(v float64) error {
	if !(v > 0 && v <= 1) {
		return fmt.Errorf("want a utilization above 0 and at most 1, got %g", v)
	}
	return nil
}

// checkShedGood accepts a good below bad.
func checkShedGood(good, bad float64) error {
	if good >= bad {
		return fmt.Errorf("want less than bad (%g), got %g", bad, good)
	}
	return nil
}

// checkShedDuration accepts a positive duration, for after and full.
func checkShedDuration(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("want a positive duration, got %s", d)
	}
	return nil
}

// checkStatus accepts a client or server error status, for a zone's or a
// shedder's rejections.
func checkStatus(code int) error {
	if code < 400 || code > 599 {
		return fmt.Errorf("want an HTTP status from 400 to 599, got %d", code)
	}
	return nil
}

// shedParams are the settings that move a shedder's amount.
type shedParams struct {
	good, bad   float64
	after, full time.Duration
}

// floor is the lowest amount, and the first: -after/full.
func (p shedParams) floor() float64 {
	return -p.after.Seconds() / p.full.Seconds()
}

// shedStep is one move of the shedding amount: the amount that follows a
// after dt at utilization u. It is the formula of SPEC §8 and nothing
// else, so that it can be tested with made-up times.
//
// At u = bad the formula's f is 0, for every bad below 1; with bad = 1
// its last case would divide by zero, so there f is 0 at u = 1 (as it is
// at u = bad below 1) and 1 above (its limit).
func shedStep(p shedParams, a, u float64, dt time.Duration) float64 {
	var f float64
	switch {
	case u < p.good:
		f = u/p.good - 1
	case u < p.bad:
		f = 0
	case p.bad >= 1:
		if u > p.bad {
			f = 1
		}
	default:
		f = (u - p.bad) / (1 - p.bad)
	}
	a += clamp(f, -1, 1) * max(dt, 0).Seconds() / p.full.Seconds()
	return clamp(a, p.floor(), 1)
}

// dropChance is the probability that a request of class i of n classes
// (0 the most important) is shed at amount a. Counted from the least
// important (j = k - i, k = n - 1), it is clamp(a*k - j, 0, 1): never for
// the first class, nothing at all with one class or at a <= 0.
func dropChance(a float64, n, i int) float64 {
	k := n - 1
	j := k - i
	return clamp(a*float64(k)-float64(j), 0, 1)
}

func clamp(v, lo, hi float64) float64 {
	return min(max(v, lo), hi)
}

// shedder is the state that the shedders of one name share: the requests
// in flight, the amount, and the one goroutine that samples the one and
// moves the other.
type shedder struct {
	name string
	// inFlight counts the requests in flight through the next handler of
	// every handler using this shedder.
	inFlight atomic.Int64
	// amount is A, as the bits of a float64: the request path reads it
	// with one atomic load.
	amount atomic.Uint64
	// shed counts the requests shed (or, in dry run, that would have been)
	// since shedding last started, for the log line when it stops.
	shed atomic.Int64

	stop, done chan struct{}

	mu sync.Mutex
	// users are the provisioned Sheds of this name, the latest last: its
	// settings apply, as a reload's new config takes over.
	users []*Shed
	// The settings in force, from the latest user.
	params   shedParams
	capacity int
	classes  []string
	dryRun   bool
	logger   *zap.Logger
	// sum and samples add up the samples of in-flight requests since the
	// last move; last is when that was.
	sum      float64
	samples  int
	last     time.Time
	u        float64
	shedding bool
	gauge    prometheus.Gauge
}

// shedders holds the shedders by name while any config uses them.
var shedders = caddy.NewUsagePool()

// newShedder makes the shared state for sh's name, starting at now with
// the amount at its floor. Its sampler is not running yet.
func newShedder(sh *Shed, now time.Time) *shedder {
	s := &shedder{
		name:  sh.name(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		last:  now,
		gauge: metrics.shedAmount.WithLabelValues(sh.name()),
	}
	s.apply(sh)
	s.store(s.params.floor())
	return s
}

// load is the amount: one atomic read.
func (s *shedder) load() float64 {
	return math.Float64frombits(s.amount.Load())
}

func (s *shedder) store(a float64) {
	s.amount.Store(math.Float64bits(a))
	s.gauge.Set(a)
}

// apply takes sh's settings; s.mu is held or s is new.
func (s *shedder) apply(sh *Shed) {
	s.params, s.capacity, s.classes, s.dryRun, s.logger = sh.params(), sh.Capacity, sh.Classes, sh.DryRun, sh.logger
	if s.logger == nil {
		s.logger = zap.NewNop()
	}
}

// use adds sh as the latest user: its settings apply.
func (s *shedder) use(sh *Shed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users = append(s.users, sh)
	s.apply(sh)
}

// release removes sh; the settings of the latest remaining user apply.
func (s *shedder) release(sh *Shed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users = slices.DeleteFunc(s.users, func(u *Shed) bool { return u == sh })
	if len(s.users) > 0 {
		s.apply(s.users[len(s.users)-1])
	}
}

// run samples the requests in flight until Destruct.
func (s *shedder) run() {
	defer close(s.done)
	ticker := time.NewTicker(shedSampleEvery)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-ticker.C:
			s.tick(now)
		}
	}
}

// tick takes one sample at now, and moves the amount if a second has
// passed since it last did.
func (s *shedder) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sum += float64(s.inFlight.Load())
	s.samples++
	// Half a sample early, so that the sample falling on the second moves
	// the amount even if its tick came a little soon.
	if now.Sub(s.last) >= shedUpdateEvery-shedSampleEvery/2 {
		s.update(now)
	}
}

// update moves the amount at now by the utilization of the samples since
// the last move, and logs when shedding starts or stops. s.mu is held.
func (s *shedder) update(now time.Time) {
	u := 0.0
	if s.samples > 0 {
		u = s.sum / float64(s.samples) / float64(s.capacity)
	}
	a := shedStep(s.params, s.load(), u, now.Sub(s.last))
	s.store(a)
	s.u, s.sum, s.samples, s.last = u, 0, 0, now
	switch {
	case a > 0 && !s.shedding:
		s.shedding = true
		s.shed.Store(0)
		s.logger.Info("load shedding started", zap.String("shedder", s.name), zap.Float64("utilization", u),
			zap.Float64("amount", a), zap.Bool("dry_run", s.dryRun))
	case a <= 0 && s.shedding:
		s.shedding = false
		s.logger.Info("load shedding stopped", zap.String("shedder", s.name), zap.Float64("utilization", u),
			zap.Float64("amount", a), zap.Int64("shed", s.shed.Load()), zap.Bool("dry_run", s.dryRun))
	}
}

// Destruct stops the sampler; the pool calls it when the last config
// using the shedder is cleaned up.
func (s *shedder) Destruct() error {
	close(s.stop)
	<-s.done
	metrics.shedAmount.DeleteLabelValues(s.name)
	return nil
}

// provision attaches sh to the shedder of its name, starting it if no
// config runs it yet. Caddy validates only after provisioning, so the
// settings are checked here first.
func (sh *Shed) provision(ctx caddy.Context, logger *zap.Logger) error {
	if err := sh.validate(); err != nil {
		return err
	}
	name := sh.name()
	sh.logger = logger
	sh.priority = compileTemplate(sh.Priority)
	sh.classIndex = make(map[string]int, len(sh.Classes))
	sh.shedTotal = make([]prometheus.Counter, len(sh.Classes))
	sh.shedErrs = make([]error, len(sh.Classes))
	for i, c := range sh.Classes {
		sh.classIndex[c] = i
		sh.shedTotal[i] = metrics.shedTotal.WithLabelValues(name, c)
		sh.shedErrs[i] = fmt.Errorf("load shed by shedder %q: class %q", name, c)
	}
	if sh.Status == 0 {
		sh.Status = DefaultShedStatus
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
	sh.state.use(sh)
	return nil
}

// cleanup lets go of the shedder; the last user stops its sampler.
func (sh *Shed) cleanup() error {
	if sh.state == nil || sh.released {
		return nil
	}
	sh.released = true
	sh.state.release(sh)
	_, err := shedders.Delete(sh.name())
	return err
}

// unmasked resolves priority templates: a zone with no IP prefixes.
var unmasked Zone

// class returns the index of the request's class: the class its priority
// names, or the last.
func (sh *Shed) class(v requestValues) int {
	last := len(sh.Classes) - 1
	if sh.Priority == "" {
		return last
	}
	p, ok := unmasked.resolve(v, sh.priority)
	if !ok {
		return last
	}
	if i, ok := sh.classIndex[strings.TrimSpace(p)]; ok {
		return i
	}
	return last
}

var retryAfterOne = []string{"1"}

// drop decides, at amount a > 0, whether to shed the request, and answers
// it if so: the shed status with Retry-After: 1 (the amount moves once a
// second), as a handler error when the server has handle_errors. In dry
// run it only counts. It reports whether the request was answered.
func (sh *Shed) drop(w http.ResponseWriter, r *http.Request, v requestValues, a float64) (bool, error) {
	i := sh.class(v)
	p := dropChance(a, len(sh.Classes), i)
	if p <= 0 || p < 1 && sh.random() >= p {
		return false, nil
	}
	sh.shedTotal[i].Inc()
	sh.state.shed.Add(1)
	if sh.DryRun {
		return false, nil
	}
	return true, refuse(w, r, sh.Status, retryAfterOne, sh.shedErrs[i])
}

// shedding checks the request against the handler's shedder: with the
// amount at or below 0, one atomic read and nothing else. It reports
// whether the request was shed and answered.
func (h *Handler) shedding(w http.ResponseWriter, r *http.Request, v requestValues) (bool, error) {
	if h.Shed == nil {
		return false, nil
	}
	if a := h.Shed.state.load(); a > 0 {
		return h.Shed.drop(w, r, v, a)
	}
	return false, nil
}

// serveNext passes the request on, counting it in flight in the handler's
// shedder while the next handler has it: one atomic add and one subtract.
func (h *Handler) serveNext(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.Shed == nil {
		return next.ServeHTTP(w, r)
	}
	n := &h.Shed.state.inFlight
	n.Add(1)
	defer n.Add(-1)
	return next.ServeHTTP(w, r)
}

// shedInfo is a shedder as GET /rate_limit/shed shows it.
type shedInfo struct {
	Name string `json:"name"`
	// Utilization is u: the average of the last second's requests in
	// flight over capacity.
	Utilization float64 `json:"utilization"`
	// Amount is A.
	Amount   float64         `json:"amount"`
	InFlight int64           `json:"in_flight"`
	Capacity int             `json:"capacity"`
	DryRun   bool            `json:"dry_run,omitempty"`
	Classes  []shedClassInfo `json:"classes"`
}

type shedClassInfo struct {
	Class      string  `json:"class"`
	DropChance float64 `json:"drop_chance"`
}

func (s *shedder) info() shedInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.load()
	out := shedInfo{Name: s.name, Utilization: s.u, Amount: a, InFlight: s.inFlight.Load(), Capacity: s.capacity, DryRun: s.dryRun,
		Classes: make([]shedClassInfo, len(s.classes))}
	for i, c := range s.classes {
		out.Classes[i] = shedClassInfo{Class: c, DropChance: dropChance(a, len(s.classes), i)}
	}
	return out
}

// listShedders answers GET /rate_limit/shed: every running shedder, by
// name.
func listShedders(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r)
	}
	out := []shedInfo{}
	shedders.Range(func(_, v any) bool {
		out = append(out, v.(*shedder).info())
		return true
	})
	slices.SortFunc(out, func(a, b shedInfo) int { return strings.Compare(a.Name, b.Name) })
	return writeJSON(w, out)
}
