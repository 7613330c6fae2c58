package data

import (
	"context"
	"sync"
	"time"
)

// tokenBucket limits a rate in bytes per second. A request larger than
// the bucket goes into debt that later requests wait off, so any size
// passes and the average rate holds.
type tokenBucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(bytesPerSec int64) *tokenBucket {
	r := float64(bytesPerSec)
	b := max(r/10, 64<<10)
	return &tokenBucket{rate: r, burst: b, tokens: b, last: time.Now()}
}

// wait takes n tokens, sleeping while the bucket is in debt. A nil bucket
// does not limit.
func (b *tokenBucket) wait(ctx context.Context, n int64) error {
	if b == nil {
		return ctx.Err()
	}
	b.mu.Lock()
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	b.tokens -= float64(n)
	debt := -b.tokens
	b.mu.Unlock()
	if debt <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(time.Duration(debt / b.rate * float64(time.Second)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
