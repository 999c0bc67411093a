package shed

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// How often a shedder samples its requests in flight, and how often it
// moves its amount: the average of the samples since the last move is the
// utilization.
const (
	sampleEvery = 50 * time.Millisecond
	updateEvery = time.Second
)

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
	params   params
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
		name:  sh.DisplayName(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		last:  now,
		gauge: metrics.amount.WithLabelValues(sh.DisplayName()),
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

// addUser adds sh as the latest user: its settings apply.
func (s *shedder) addUser(sh *Shed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users = append(s.users, sh)
	s.apply(sh)
}

// removeUser removes sh; the settings of the latest remaining user apply.
func (s *shedder) removeUser(sh *Shed) {
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
	ticker := time.NewTicker(sampleEvery)
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
	if now.Sub(s.last) >= updateEvery-sampleEvery/2 {
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
	a := step(s.params, s.load(), u, now.Sub(s.last))
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
	metrics.amount.DeleteLabelValues(s.name)
	return nil
}
