package faults_test

import (
	"bufio"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/workpump/workpump/internal/faults"
)

// echoServer echoes lines back and records how many of its connections
// have ended (the upstream side of a cut must end too: that is what makes
// Postgres drop the session and its locks).
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	ended int
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
				s.mu.Lock()
				s.ended++
				s.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *echoServer) endedConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func roundTrip(c net.Conn, r *bufio.Reader, msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return line[:len(line)-1], nil
}

func dial(t *testing.T, p *faults.Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

func TestProxyForwardsCutsRefusesAndRestores(t *testing.T) {
	echo := newEcho(t)
	p, err := faults.NewProxy(echo.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	c1, r1 := dial(t, p)
	if got, err := roundTrip(c1, r1, "hello"); err != nil || got != "hello" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	if p.Live() != 1 {
		t.Fatalf("Live = %d, want 1", p.Live())
	}

	if n := p.Cut(); n != 1 {
		t.Fatalf("Cut dropped %d connections, want 1", n)
	}
	// The client side ends...
	if _, err := roundTrip(c1, r1, "after cut"); err == nil {
		t.Fatal("a cut connection still carries data")
	}
	// ...and so does the upstream side, which is what ends a server session.
	deadline := time.Now().Add(10 * time.Second)
	for echo.endedConns() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the upstream connection was not closed by the cut")
		}
		time.Sleep(5 * time.Millisecond) // real sockets: the close is asynchronous
	}

	// While cut, new connections are accepted and closed at once.
	c2, r2 := dial(t, p)
	if _, err := roundTrip(c2, r2, "refused"); err == nil {
		t.Fatal("a connection made while cut carried data")
	}

	p.Restore()
	c3, r3 := dial(t, p)
	if got, err := roundTrip(c3, r3, "again"); err != nil || got != "again" {
		t.Fatalf("after Restore: %q, %v", got, err)
	}
	st := p.Stats()
	if st.Accepted != 2 || st.Refused != 1 || st.Dropped != 1 || st.Cuts != 1 {
		t.Fatalf("Stats = %+v, want 2 accepted, 1 refused, 1 dropped, 1 cut", st)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(c3, r3, "closed"); err == nil {
		t.Fatal("Close left a connection open")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestProxyCutForRestoresByItself(t *testing.T) {
	echo := newEcho(t)
	p, err := faults.NewProxy(echo.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.CutFor(50 * time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, r := dial(t, p)
		if got, err := roundTrip(c, r, "x"); err == nil && got == "x" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("CutFor never restored the proxy")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
