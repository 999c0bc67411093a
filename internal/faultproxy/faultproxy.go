// Package faultproxy is a TCP proxy for tests that puts faults between a
// client and a server: it delays every chunk of data by a set latency,
// resets every open connection, or resets new connections as soon as they
// are accepted. A test points its client at the proxy instead of the server
// and turns the faults on and off while traffic flows.
//
// The proxy listens on a free port of 127.0.0.1 and forwards each accepted
// connection to one target, in both directions. Faults apply at once, to
// connections already open as well as to new ones.
package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards connections from its own address to a target.
type Proxy struct {
	target string
	ln     net.Listener

	// ctx is cancelled by Close, so that a dial to the target in flight
	// gives up instead of holding Close up.
	ctx    context.Context
	cancel context.CancelFunc

	refuse atomic.Bool

	mu      sync.Mutex
	latency time.Duration
	// latencyChanged is closed and replaced when the latency changes, to
	// wake writers waiting out the old one.
	latencyChanged chan struct{}
	conns          map[*conn]struct{}
	closed         bool

	// wg counts every goroutine the proxy started, so that Close returns
	// only when all of them are gone.
	wg sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and forwards every accepted
// connection to target (host:port) until Close.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target:         target,
		ln:             ln,
		ctx:            ctx,
		cancel:         cancel,
		latencyChanged: make(chan struct{}),
		conns:          make(map[*conn]struct{}),
	}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is the proxy's address as a redis:// URL.
func (p *Proxy) URL() string { return "redis://" + p.Addr() }

// SetLatency delays every chunk read from now on, in either direction, so
// that it is delivered d after it was read. Chunks keep their order, and a
// connection still carries many chunks per d: each waits for its own read
// time plus d, not for the chunk before it plus d. Chunks already waiting
// take the new d too. Zero turns the delay off.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
	close(p.latencyChanged)
	p.latencyChanged = make(chan struct{})
}

// delay returns the latency and a channel closed when it next changes.
func (p *Proxy) delay() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.latency, p.latencyChanged
}

// hold waits until the chunk read at read is due under the current latency,
// and reports false if c was shut meanwhile.
func (p *Proxy) hold(c *conn, read time.Time) bool {
	for {
		d, changed := p.delay()
		wait := time.Until(read.Add(d))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
			return true
		case <-changed:
			t.Stop()
		case <-c.done:
			t.Stop()
			return false
		}
	}
}

// SetRefuse makes the proxy, while on is true, accept new connections and
// reset them at once, as a load balancer does in front of a dead server:
// the client's connect succeeds and its first read fails.
func (p *Proxy) SetRefuse(on bool) { p.refuse.Store(on) }

// Reset closes every open connection now with a TCP RST on both sides, as a
// crashed peer or a dropped route would, and returns how many there were.
// New connections are still accepted. A command in flight, or the next
// command on a connection the client holds, fails; but a pool that checks
// an idle connection before lending it (go-redis does) drops a reset one
// quietly and dials anew.
func (p *Proxy) Reset() int {
	n := 0
	for _, c := range p.snapshot() {
		if c.shut(true) {
			n++
		}
	}
	return n
}

// Close stops listening, closes every open connection, and returns when all
// of the proxy's goroutines have ended. Calling it again does nothing, so a
// test may both defer it and call it.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.ln.Close()
	for _, c := range p.snapshot() {
		c.shut(false)
	}
	p.wg.Wait()
}

func (p *Proxy) snapshot() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	return conns
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error (out of file descriptors, say): the
			// listener is still open, so keep accepting, after a pause
			// that keeps the loop from spinning.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if p.refuse.Load() {
			rst(c)
			continue
		}
		p.wg.Go(func() { p.serve(c.(*net.TCPConn)) })
	}
}

// rst closes c with a TCP RST instead of a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// serve dials the target for client and copies both ways until either
// side fails or both have finished sending.
func (p *Proxy) serve(client *net.TCPConn) {
	var d net.Dialer
	s, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		// The target is down: the client sees its connection reset, as it
		// would connecting to the target directly.
		rst(client)
		return
	}
	c := &conn{client: client, server: s.(*net.TCPConn), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.shut(false)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(c, c.client, c.server) })
	wg.Go(func() { p.pipe(c, c.server, c.client) })
	wg.Wait()
	c.shut(false)

	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// conn is one proxied connection: the accepted client side and the dialled
// server side.
type conn struct {
	client, server *net.TCPConn

	mu     sync.Mutex
	closed bool
	// done is closed when the connection is shut, to wake a writer that
	// waits out the latency.
	done chan struct{}
}

// shut closes both sides, with a RST if rst is set, and reports whether
// this call was the one that closed them.
func (c *conn) shut(rst bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.closed = true
	close(c.done)
	if rst {
		c.client.SetLinger(0)
		c.server.SetLinger(0)
	}
	c.client.Close()
	c.server.Close()
	return true
}

// chunk is data read from one side, stamped with when it was read.
type chunk struct {
	data []byte
	read time.Time
}

// pipe copies src to dst. A reader and a writer run apart, joined by a
// queue of stamped chunks, so that a latency delays each chunk by d from
// its own read rather than serializing the connection by d per chunk.
// When src ends cleanly, dst's sending side is closed once the queue is
// drained, so a half-close passes through; on any error the whole
// connection is reset, as the peer's failure would show to a direct client.
func (p *Proxy) pipe(c *conn, src, dst *net.TCPConn) {
	queue := make(chan chunk, 64)
	var writer sync.WaitGroup
	writer.Go(func() {
		for ch := range queue {
			if !p.hold(c, ch.read) {
				return
			}
			if _, err := dst.Write(ch.data); err != nil {
				c.shut(true)
				return
			}
		}
		dst.CloseWrite()
	})
	defer writer.Wait()
	defer close(queue)

	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch := chunk{data: append([]byte(nil), buf[:n]...), read: time.Now()}
			select {
			case queue <- ch:
			case <-c.done:
				return
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			c.shut(true)
			return
		}
	}
}
