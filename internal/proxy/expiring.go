package proxy

import (
	"sync"
	"time"
)

// expiring caches values until their own expiry time. Keys name the
// sandbox (and whatever else the value depends on), so one sandbox's
// credentials never serve another's requests. Expired entries are dropped
// as new ones are put, which bounds the map by what is live.
type expiring[V any] struct {
	mu sync.Mutex
	m  map[string]expiringEntry[V]
}

type expiringEntry[V any] struct {
	v   V
	exp time.Time
}

// get returns key's value if it is still valid at now.
func (c *expiring[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !now.Before(e.exp) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// put stores v under key until exp.
func (c *expiring[V]) put(key string, v V, exp, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]expiringEntry[V]{}
	}
	for k, e := range c.m {
		if !now.Before(e.exp) {
			delete(c.m, k)
		}
	}
	c.m[key] = expiringEntry[V]{v, exp}
}
