package meta

import (
	"sync"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// A new file's layout is the nearest default layout at or above its
// directory: a walk up the parents, two reads per level. The walk's
// result is cached per directory, tagged with the layout generation
// (n/lg), a counter every change that could alter a walk's result bumps
// in its own transaction: a default layout set on a directory, a
// directory moved to another parent (rename, fsck's repairs). A create
// then reads one key instead of walking; since it reads the generation
// in its transaction, a change committed meanwhile (by this or another
// meta server) is seen, or makes the transaction conflict. A create in a
// directory whose layout is cached does not even look first: it places
// the file from the cache and its one transaction checks the generation
// (falling back to look, place, create when it moved).

// maxLayoutCache bounds the directories cached; past it the cache starts
// over.
const maxLayoutCache = 1 << 16

// layoutCache holds effective layouts of directories at one generation.
type layoutCache struct {
	mu  sync.Mutex
	gen uint64
	m   map[uint64]*weftv1.Layout
}

// bumpLayoutGen records a change that may alter directories' effective
// layouts.
func (x *tx) bumpLayoutGen() error {
	n, err := getUint64(x.t, keyLayoutGen)
	if err != nil {
		return err
	}
	return x.t.Set(keyLayoutGen, be64(n+1))
}

// peekEffectiveLayout returns dir's effective layout from the cache
// (the caller's copy) and the layout generation it holds at, without
// reading the engine: a transaction using it must check that n/lg is
// still gen.
func (s *Service) peekEffectiveLayout(dir uint64) (l *weftv1.Layout, gen uint64, ok bool) {
	c := &s.layouts
	c.mu.Lock()
	defer c.mu.Unlock()
	cached := c.m[dir]
	if cached == nil {
		return nil, 0, false
	}
	return proto.Clone(cached).(*weftv1.Layout), c.gen, true
}

// cachedEffectiveLayout is x.effectiveLayout(dir, the default layout),
// from the cache when it holds dir at the current generation. The result
// is the caller's.
func (s *Service) cachedEffectiveLayout(x *tx, dir uint64) (*weftv1.Layout, error) {
	gen, err := getUint64(x.t, keyLayoutGen)
	if err != nil {
		return nil, err
	}
	c := &s.layouts
	c.mu.Lock()
	if c.gen == gen {
		if l := c.m[dir]; l != nil {
			c.mu.Unlock()
			return proto.Clone(l).(*weftv1.Layout), nil
		}
	}
	c.mu.Unlock()
	l, err := x.effectiveLayout(dir, s.cfg.DefaultLayout)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || c.gen != gen || len(c.m) >= maxLayoutCache {
		c.gen, c.m = gen, make(map[uint64]*weftv1.Layout)
	}
	c.m[dir] = proto.Clone(l).(*weftv1.Layout)
	c.mu.Unlock()
	return l, nil
}
