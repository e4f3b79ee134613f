// Package health answers whether the daemon can do its job: each part it
// depends on (the state database, the copy-on-write store and the host
// filesystem under it, the sandbox runtime, the egress proxy) is probed on
// demand, and the report says which failed and why.
//
// A probe that fails makes the daemon "degraded". A probe of a critical
// part that fails makes it "unavailable": it cannot create sandboxes (the
// API's /healthz answers 503), unless the probe marked its failure as a
// warning with Warn (e.g. space running low but not yet gone).
package health

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Statuses of a check and of a whole report.
const (
	StatusOK          = "ok"
	StatusDegraded    = "degraded"
	StatusUnavailable = "unavailable"
)

// probeTimeout bounds one probe: a wedged part is reported, never waited on.
const probeTimeout = 3 * time.Second

// Check is one probed part. Probe returns nil when the part works.
type Check struct {
	Name     string
	Critical bool
	Probe    func(ctx context.Context) error
}

// Report is the outcome of every check, in the order they were given.
type Report struct {
	Status string                 `json:"status"`
	Checks []protocol.HealthCheck `json:"checks"`
}

// OK reports whether every check passed.
func (r Report) OK() bool { return r.Status == StatusOK }

// Reasons lists the failed checks' reasons, each prefixed by its check.
func (r Report) Reasons() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status != StatusOK {
			out = append(out, c.Name+": "+c.Reason)
		}
	}
	return out
}

// warning marks a failure that degrades the daemon without stopping it.
type warning struct{ error }

func (w warning) Unwrap() error { return w.error }

// Warn marks err as a warning: the check reports degraded even when it is
// critical. Warn(nil) is nil.
func Warn(err error) error {
	if err == nil {
		return nil
	}
	return warning{err}
}

// IsWarning reports whether err was marked with Warn.
func IsWarning(err error) bool {
	var w warning
	return errors.As(err, &w)
}

// Checker runs a fixed set of checks. Safe for concurrent use.
type Checker struct {
	checks []Check

	mu     sync.Mutex // guards last, lastAt
	last   Report
	lastAt time.Time
}

// New returns a Checker of checks (nil probes are skipped).
func New(checks ...Check) *Checker {
	c := &Checker{}
	for _, ch := range checks {
		if ch.Probe != nil {
			c.checks = append(c.checks, ch)
		}
	}
	return c
}

// Run probes every check concurrently, each within probeTimeout.
func (c *Checker) Run(ctx context.Context) Report {
	rep := c.run(ctx)
	c.mu.Lock()
	c.last, c.lastAt = rep, time.Now()
	c.mu.Unlock()
	return rep
}

func (c *Checker) run(ctx context.Context) Report {
	results := make([]protocol.HealthCheck, len(c.checks))
	var wg sync.WaitGroup
	for i, ch := range c.checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = probe(ctx, ch)
		}()
	}
	wg.Wait()
	rep := Report{Status: StatusOK, Checks: results}
	for _, r := range results {
		switch {
		case r.Status == StatusUnavailable:
			rep.Status = StatusUnavailable
		case r.Status == StatusDegraded && rep.Status == StatusOK:
			rep.Status = StatusDegraded
		}
	}
	return rep
}

// Recent returns a report no older than maxAge, running the checks only
// when the last one is older: for gating hot paths (every create) without
// probing on each.
func (c *Checker) Recent(ctx context.Context, maxAge time.Duration) Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastAt.IsZero() || time.Since(c.lastAt) > maxAge {
		c.last, c.lastAt = c.run(ctx), time.Now()
	}
	return c.last
}

// probe runs one check. A probe that outlives its deadline is reported as
// failed; its goroutine ends when the probe does.
func probe(ctx context.Context, ch Check) protocol.HealthCheck {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ch.Probe(ctx) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = errors.New("no answer within " + probeTimeout.String())
	}
	r := protocol.HealthCheck{Name: ch.Name, Status: StatusOK}
	if err == nil {
		return r
	}
	r.Reason = err.Error()
	switch {
	case IsWarning(err), !ch.Critical:
		r.Status = StatusDegraded
	default:
		r.Status = StatusUnavailable
	}
	return r
}
