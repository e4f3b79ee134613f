package api

import (
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"golang.org/x/time/rate"
)

// RateLimit is the per-key request rate: a token bucket of Burst requests
// refilled at PerSecond. PerSecond ≤ 0 turns it off.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// DefaultRateLimit is generous: it stops a runaway client, not a busy
// one. One client running commands back to back on the namespace runtime
// sends about 500 requests a second (BenchmarkExecRoundTrip, 2 ms a round
// trip), which must stay under it.
var DefaultRateLimit = RateLimit{PerSecond: 1000, Burst: 2000}

// WithRateLimit limits every authenticated request per API key.
func WithRateLimit(l RateLimit) Option {
	return func(s *Server) {
		if l.PerSecond > 0 {
			s.limiter = newKeyLimiter(l)
		}
	}
}

// keyLimiter holds a token bucket per API key. A bucket left idle for
// refill (the time an empty bucket takes to fill) is full, the same as a
// new one, so it is dropped: memory is bounded by the keys active within
// one refill period.
type keyLimiter struct {
	limit  rate.Limit
	burst  int
	refill time.Duration

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

func newKeyLimiter(l RateLimit) *keyLimiter {
	burst := max(l.Burst, 1)
	return &keyLimiter{limit: rate.Limit(l.PerSecond), burst: burst, buckets: map[string]*bucket{},
		refill: time.Duration(float64(burst) / l.PerSecond * float64(time.Second))}
}

// wait takes a token from key's bucket at now, returning 0, or returns how
// long until one is there (and takes nothing).
func (k *keyLimiter) wait(key string, now time.Time) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Sub(k.lastSweep) > k.refill {
		for id, b := range k.buckets {
			if now.Sub(b.last) > k.refill {
				delete(k.buckets, id)
			}
		}
		k.lastSweep = now
	}
	b := k.buckets[key]
	if b == nil {
		b = &bucket{lim: rate.NewLimiter(k.limit, k.burst)}
		k.buckets[key] = b
	}
	b.last = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}

// admit returns a rate LimitError if p's key has no token left.
func (k *keyLimiter) admit(p auth.Principal) error {
	key := p.KeyID
	if key == "" {
		key = p.WorkspaceID + "/" + p.User
	}
	if d := k.wait(key, time.Now()); d > 0 {
		return &errdefs.LimitError{Kind: errdefs.RateLimit, RetryAfter: d,
			Msg: fmt.Sprintf("more than %g requests a second (burst %d) with this API key", float64(k.limit), k.burst)}
	}
	return nil
}
