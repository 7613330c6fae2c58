package faultproxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer answers every line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends a line on c and waits up to wait for the echo.
func roundTrip(c net.Conn, line string, wait time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestProxy(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, p *Proxy)
	}{
		{"forwards", func(t *testing.T, p *Proxy) {
			c := dial(t, p)
			for _, line := range []string{"one", "two"} {
				if got, err := roundTrip(c, line, 5*time.Second); err != nil || got != line {
					t.Fatalf("echo of %q = %q, %v", line, got, err)
				}
			}
		}},
		{"cut closes open connections and refuses new ones", func(t *testing.T, p *Proxy) {
			c := dial(t, p)
			if _, err := roundTrip(c, "before", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			p.Cut()
			if got, err := roundTrip(c, "after", 5*time.Second); err == nil {
				t.Fatalf("open connection still works after Cut: %q", got)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("open connection hangs after Cut instead of closing: %v", err)
			}
			c2 := dial(t, p)
			if got, err := roundTrip(c2, "new", 5*time.Second); err == nil {
				t.Fatalf("new connection works after Cut: %q", got)
			}
			if p.Mode() != Refuse {
				t.Errorf("mode = %v, want refuse", p.Mode())
			}
		}},
		{"restore after cut", func(t *testing.T, p *Proxy) {
			p.Cut()
			p.Restore()
			c := dial(t, p)
			if got, err := roundTrip(c, "again", 5*time.Second); err != nil || got != "again" {
				t.Fatalf("echo after Restore = %q, %v", got, err)
			}
		}},
		{"blackhole hangs open and new connections", func(t *testing.T, p *Proxy) {
			c := dial(t, p)
			if _, err := roundTrip(c, "before", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			p.Blackhole()
			for _, conn := range []net.Conn{c, dial(t, p)} {
				_, err := roundTrip(conn, "lost", 300*time.Millisecond)
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					t.Fatalf("traffic through a blackhole: err %v, want a timeout", err)
				}
			}
			p.Restore()
			c3 := dial(t, p)
			if got, err := roundTrip(c3, "back", 5*time.Second); err != nil || got != "back" {
				t.Fatalf("echo after Restore = %q, %v", got, err)
			}
		}},
		{"latency", func(t *testing.T, p *Proxy) {
			p.SetLatency(100 * time.Millisecond)
			c := dial(t, p)
			start := time.Now()
			if _, err := roundTrip(c, "slow", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			// One delay each way.
			if d := time.Since(start); d < 200*time.Millisecond {
				t.Fatalf("round trip took %v with 100ms latency each way", d)
			}
		}},
		{"latency delays, it does not limit the rate", func(t *testing.T, p *Proxy) {
			// 4 MiB each way is 64 segments of at most 64 KiB: held
			// back one after another, they would take 64 latencies
			// (12.8 s) each way; delayed together, about one.
			const lat = 200 * time.Millisecond
			p.SetLatency(lat)
			c := dial(t, p)
			c.SetDeadline(time.Now().Add(time.Minute))
			data := make([]byte, 4<<20)
			for i := range data {
				data[i] = byte(i * 7)
			}
			start := time.Now()
			go c.Write(data)
			got := make([]byte, len(data))
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatal(err)
			}
			d := time.Since(start)
			if !bytes.Equal(got, data) {
				t.Fatal("the bytes came back changed")
			}
			if d < 2*lat || d > 32*lat {
				t.Fatalf("4 MiB echoed in %v with %v latency each way; want about %v, far below 64 x %v", d, lat, 2*lat, lat)
			}
		}},
		{"close ends connections", func(t *testing.T, p *Proxy) {
			c := dial(t, p)
			if _, err := roundTrip(c, "x", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := roundTrip(c, "y", 5*time.Second); err == nil {
				t.Fatal("connection works after Close")
			}
			if _, err := net.Dial("tcp", p.Addr()); err == nil {
				t.Fatal("proxy still accepts after Close")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newProxy(t)) })
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := New(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c := dial(t, p)
	if _, err := roundTrip(c, "nobody", 5*time.Second); err == nil {
		t.Fatal("a connection to a dead upstream works")
	}
}
