package pebblekv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weft-fs/weft/meta/kv"
)

// TestGroupsMatchModel runs random groups of transactions (gets, scans,
// sets, deletes; some failing after they wrote) through UpdateAll, which
// commits a group in its order, and checks every read against a model map
// that applies the same transactions one after the other. The cache is
// tiny, so values and absences are evicted all the time; every few groups
// a view compares the whole database with the model.
func TestGroupsMatchModel(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			e := openTest(t, nil)
			e.cache = newValueCache(2048)
			rng := rand.New(rand.NewPCG(seed, 7))
			model := map[string]string{}
			key := func() string { return fmt.Sprintf("k/%02d", rng.IntN(40)) }
			for round := range 150 {
				n := 1 + rng.IntN(12)
				ctxs := make([]context.Context, n)
				fns := make([]func(kv.Txn) error, n)
				var problems []string
				failed := errors.New("transaction gives up")
				for i := range n {
					ctxs[i] = context.Background()
					ops := make([]int, 1+rng.IntN(8))
					for j := range ops {
						ops[j] = rng.IntN(10)
					}
					keys := make([]string, len(ops))
					vals := make([]string, len(ops))
					for j := range ops {
						keys[j], vals[j] = key(), fmt.Sprintf("v%d.%d.%d", round, i, j)
					}
					fail := rng.IntN(5) == 0
					fns[i] = func(tx kv.Txn) error {
						// The transaction's view: the model after the
						// group's earlier transactions, plus its own writes.
						own := map[string]*string{}
						state := func(k string) (string, bool) {
							if v, ok := own[k]; ok {
								if v == nil {
									return "", false
								}
								return *v, true
							}
							v, ok := model[k]
							return v, ok
						}
						for j, op := range ops {
							k := keys[j]
							switch {
							case op < 4:
								v, ok, err := tx.Get([]byte(k))
								if err != nil {
									return err
								}
								if want, wok := state(k); ok != wok || string(v) != want {
									problems = append(problems, fmt.Sprintf("round %d txn %d: get %s = %q %v, want %q %v", round, i, k, v, ok, want, wok))
								}
							case op < 5:
								lo, hi := key(), key()
								if hi < lo {
									lo, hi = hi, lo
								}
								var got []string
								if err := tx.Scan([]byte(lo), []byte(hi), func(k, v []byte) (bool, error) {
									got = append(got, string(k)+"="+string(v))
									return true, nil
								}); err != nil {
									return err
								}
								var want []string
								for mk := range model {
									if _, ok := own[mk]; !ok && mk >= lo && mk < hi {
										want = append(want, mk+"="+model[mk])
									}
								}
								for ok, v := range own {
									if v != nil && ok >= lo && ok < hi {
										want = append(want, ok+"="+*v)
									}
								}
								slices.Sort(want)
								if !slices.Equal(got, want) {
									problems = append(problems, fmt.Sprintf("round %d txn %d: scan [%s,%s) = %v, want %v", round, i, lo, hi, got, want))
								}
							case op < 8:
								if err := tx.Set([]byte(k), []byte(vals[j])); err != nil {
									return err
								}
								v := vals[j]
								own[k] = &v
							default:
								if err := tx.Delete([]byte(k)); err != nil {
									return err
								}
								own[k] = nil
							}
						}
						if fail {
							return failed
						}
						for k, v := range own {
							if v == nil {
								delete(model, k)
							} else {
								model[k] = *v
							}
						}
						return nil
					}
				}
				for i, err := range e.UpdateAll(ctxs, fns) {
					if err != nil && !errors.Is(err, failed) {
						t.Fatalf("round %d txn %d: %v", round, i, err)
					}
				}
				if len(problems) > 0 {
					t.Fatalf("seed %d:\n%s", seed, strings.Join(problems, "\n"))
				}
				if round%10 == 0 {
					checkAgainst(t, e, model)
				}
			}
			checkAgainst(t, e, model)
		})
	}
}

// checkAgainst compares the whole database (through a view) with model.
func checkAgainst(t *testing.T, e *Engine, model map[string]string) {
	t.Helper()
	got := map[string]string{}
	if err := e.View(context.Background(), func(tx kv.Txn) error {
		return tx.Scan(nil, nil, func(k, v []byte) (bool, error) {
			got[string(k)] = string(v)
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	for k, v := range model {
		if got[k] != v {
			t.Errorf("database holds %q = %q, model %q", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := model[k]; !ok {
			t.Errorf("database holds %q, the model does not", k)
		}
	}
}

// A key read, then set and deleted over and over (a file opened and
// released), is answered by the cache from its first read on: pebble
// would step over every older version to find it deleted.
func TestCacheKeepsChurnedKeysKnown(t *testing.T) {
	e := openTest(t, nil)
	ctx := context.Background()
	key := []byte("n/o/churned")
	before := e.dbGets
	for i := range 200 {
		err := e.Update(ctx, func(tx kv.Txn) error {
			_, ok, err := tx.Get(key)
			if err != nil {
				return err
			}
			if ok == (i%2 == 0) {
				return fmt.Errorf("round %d: key present %v", i, ok)
			}
			if ok {
				return tx.Delete(key)
			}
			return tx.Set(key, []byte{byte(i)})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := e.dbGets - before; n > 1 {
		t.Errorf("%d of 200 reads went to pebble, want 1 (the first)", n)
	}
}
