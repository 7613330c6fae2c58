package campaign

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/faultproxy"
)

// injector applies a schedule to the cluster.
type injector struct {
	c   *cluster
	rec *recorder

	mu      sync.Mutex
	active  map[string]int         // faults in force by target name
	targets map[string]*sync.Mutex // held by the fault in force on a target
}

func newInjector(c *cluster, rec *recorder) *injector {
	return &injector{c: c, rec: rec, active: map[string]int{}, targets: map[string]*sync.Mutex{}}
}

// lockTarget waits until target has no fault in force (a fault's healing
// may take longer than the schedule planned) and holds it.
func (in *injector) lockTarget(target string) *sync.Mutex {
	in.mu.Lock()
	l := in.targets[target]
	if l == nil {
		l = new(sync.Mutex)
		in.targets[target] = l
	}
	in.mu.Unlock()
	l.Lock()
	return l
}

// busy reports whether target has a fault in force (the watchdog leaves
// it alone).
func (in *injector) busy(target string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.active[target] > 0
}

func (in *injector) mark(target string, d int) {
	in.mu.Lock()
	in.active[target] += d
	in.mu.Unlock()
}

// run injects every fault of s at its time from t0 and heals it after its
// duration; it returns when all are healed or stop is closed (then the
// faults in force are healed at once).
func (in *injector) run(t0 time.Time, s Schedule, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, f := range s {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-stop:
				return
			case <-time.After(time.Until(t0.Add(f.At))):
			}
			in.mark(f.targetName(), 1)
			defer in.mark(f.targetName(), -1)
			l := in.lockTarget(f.targetName())
			defer l.Unlock()
			if late := time.Since(t0.Add(f.At)); late > time.Second {
				in.c.cfg.Logf("%s fault %s starts %.1fs late: the last fault of its target took longer to heal",
					time.Now().Format("15:04:05.000"), f, late.Seconds())
			}
			w := in.rec.open(f)
			in.c.cfg.Logf("%s fault: %s", time.Now().Format("15:04:05.000"), f)
			heal, err := in.inject(f)
			if err != nil {
				in.rec.find("inject %s: %v", f, err)
			}
			select {
			case <-stop:
			case <-time.After(time.Until(w.start.Add(f.For))):
			}
			if heal != nil {
				if err := heal(); err != nil {
					in.rec.find("heal %s: %v", f, err)
				}
			}
			in.rec.close(w)
			in.c.cfg.Logf("%s healed: %s (in force %.1fs)", time.Now().Format("15:04:05.000"), f, w.end.Sub(w.start).Seconds())
		}()
	}
	wg.Wait()
}

// inject applies f and returns what heals it.
func (in *injector) inject(f Fault) (func() error, error) {
	c := in.c
	switch f.Kind.class() {
	case "data":
		d := c.data[f.Target]
		d.mu.Lock()
		p := d.proc
		front := []*faultproxy.Proxy{d.front}
		links := d.metaLinks
		d.mu.Unlock()
		switch f.Kind {
		case DataKill, DataNewPort:
			p.stop(syscall.SIGKILL, 10*time.Second)
			return func() error { return c.startData(d, f.Kind == DataNewPort) }, nil
		case DataStop:
			if !p.stop(syscall.SIGTERM, cleanStopWait) {
				in.rec.find("%s did not stop within %v of SIGTERM (killed)", f.targetName(), cleanStopWait)
			}
			return func() error { return c.startData(d, false) }, nil
		case DataPause:
			p.signal(syscall.SIGSTOP)
			return func() error { p.signal(syscall.SIGCONT); return nil }, nil
		case DataPartition:
			cut(append(front, links...), f.Blackhole)
			return func() error { restore(append(front, links...)); return nil }, nil
		case DataSlow:
			slow(front, f.Latency)
			return func() error { slow(front, 0); return nil }, nil
		}
	case "meta":
		m := c.metas[f.Target]
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		front := []*faultproxy.Proxy{m.front}
		switch f.Kind {
		case MetaKill:
			p.stop(syscall.SIGKILL, 10*time.Second)
			return func() error { return c.startMeta(m) }, nil
		case MetaStop:
			if !p.stop(syscall.SIGTERM, cleanStopWait) {
				in.rec.find("%s did not stop within %v of SIGTERM (killed)", f.targetName(), cleanStopWait)
			}
			return func() error { return c.startMeta(m) }, nil
		case MetaPartition:
			if m.etcdLink != nil {
				front = []*faultproxy.Proxy{m.etcdLink}
			}
			cut(front, f.Blackhole)
			return func() error { restore(front); return nil }, nil
		case MetaSlow:
			slow(front, f.Latency)
			return func() error { slow(front, 0); return nil }, nil
		}
	case "client":
		mt := c.mounts[f.Target]
		mt.mu.Lock()
		p := mt.proc
		mt.mu.Unlock()
		switch f.Kind {
		case ClientKill:
			p.stop(syscall.SIGKILL, 10*time.Second)
			return func() error { return c.startMount(mt) }, c.downMount(mt)
		case ClientStop:
			// As an administrator stops a mount in use: the
			// applications close their files, and weft mount
			// flushes, unmounts and exits.
			c.markDown(mt)
			var err error
			if !p.stop(syscall.SIGTERM, cleanStopWait) {
				err = fmt.Errorf("weft mount did not exit within %v of SIGTERM though every file on it was closed (killed)", cleanStopWait)
			}
			if derr := c.downMount(mt); derr != nil && err == nil {
				err = derr
			}
			return func() error { return c.startMount(mt) }, err
		case ClientPause:
			p.signal(syscall.SIGSTOP)
			return func() error { p.signal(syscall.SIGCONT); return nil }, nil
		}
	}
	return nil, fmt.Errorf("unknown fault kind %q", f.Kind)
}

func cut(ps []*faultproxy.Proxy, blackhole bool) {
	for _, p := range ps {
		if blackhole {
			p.Blackhole()
		} else {
			p.Cut()
		}
	}
}

func restore(ps []*faultproxy.Proxy) {
	for _, p := range ps {
		p.Restore()
	}
}

func slow(ps []*faultproxy.Proxy, d time.Duration) {
	for _, p := range ps {
		p.SetLatency(d)
	}
}

// watch finds processes that exit without the campaign stopping them (a
// crash) until stop is closed, and starts them again.
func (in *injector) watch(stop <-chan struct{}) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for name, p := range in.c.procs() {
			if !p.unexpectedExit() || in.busy(name) {
				continue
			}
			p.mu.Lock()
			p.expected = true // reported once
			p.mu.Unlock()
			in.rec.find("%s exited by itself (%s); the end of its log:\n%s", name, p.err, logTail(in.c.logDir, name, 30))
			if err := in.restart(name); err != nil {
				in.rec.find("restart %s after its crash: %v", name, err)
			}
		}
	}
}

// restart starts the named process again after a crash.
func (in *injector) restart(name string) error {
	c := in.c
	for _, m := range c.metas {
		if c.name("meta", m.i) == name {
			return c.startMeta(m)
		}
	}
	for _, d := range c.data {
		if c.name("data", d.i) == name {
			return c.startData(d, false)
		}
	}
	for _, m := range c.mounts {
		if c.name("mount", m.i) == name {
			c.downMount(m)
			return c.startMount(m)
		}
	}
	return fmt.Errorf("no process %s", name)
}
