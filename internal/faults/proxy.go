package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one upstream address (a
// Postgres server), for cutting the network under the connections made
// through it and no others: put it in front of a listener connection only
// (pgxdriver.Options.ListenerConnString) and the pool keeps working while
// the listener breaks, as when a NAT or load balancer drops one idle
// connection. Safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	conns   map[*proxied]struct{}
	refuse  bool
	restore *time.Timer
	closed  bool

	wg       sync.WaitGroup
	accepted atomic.Int64
	refused  atomic.Int64
	dropped  atomic.Int64
	cuts     atomic.Int64
}

// proxied is one client connection and its upstream connection.
type proxied struct {
	client, server net.Conn
	once           sync.Once
}

func (c *proxied) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

// NewProxy listens on 127.0.0.1 (a free port) and forwards each accepted
// connection to upstream (host:port).
func NewProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, upstream: upstream, conns: map[*proxied]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			// Accept and close at once: the client sees its connection
			// reset before the server said anything, as with a dead route.
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxied{client: client, server: server}
	p.mu.Lock()
	if p.refuse || p.closed {
		p.mu.Unlock()
		p.refused.Add(1)
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)
	var done sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer done.Done()
		_, _ = io.Copy(dst, src)
		c.close() // either side ending ends both
	}
	done.Add(2)
	go pipe(server, client)
	go pipe(client, server)
	done.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Cut drops every live connection through the proxy (both sides are
// closed: the server ends the session, releasing its session locks) and
// refuses new connections until Restore. It returns how many it dropped.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	p.refuse = true
	if p.restore != nil {
		p.restore.Stop()
		p.restore = nil
	}
	live := make([]*proxied, 0, len(p.conns))
	for c := range p.conns {
		live = append(live, c)
	}
	p.mu.Unlock()
	for _, c := range live {
		c.close()
	}
	p.cuts.Add(1)
	p.dropped.Add(int64(len(live)))
	return len(live)
}

// CutFor cuts now and restores after d.
func (p *Proxy) CutFor(d time.Duration) int {
	n := p.Cut()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.restore = time.AfterFunc(d, p.Restore)
	}
	return n
}

// Restore accepts connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = false
	if p.restore != nil {
		p.restore.Stop()
		p.restore = nil
	}
}

// Live returns the number of connections currently forwarded.
func (p *Proxy) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// ProxyStats counts what a proxy did.
type ProxyStats struct {
	Accepted, Refused, Dropped, Cuts int64
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() ProxyStats {
	return ProxyStats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Dropped: p.dropped.Load(), Cuts: p.cuts.Load()}
}

// Close stops listening, drops every connection and waits for the
// proxy's goroutines. Idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.restore != nil {
		p.restore.Stop()
		p.restore = nil
	}
	live := make([]*proxied, 0, len(p.conns))
	for c := range p.conns {
		live = append(live, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range live {
		c.close()
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
