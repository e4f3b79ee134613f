package proxy

import (
	"sync"
	"time"
)

// Event is one egress decision, as the egress-log API shows it.
type Event struct {
	Time time.Time `json:"time"`
	// Kind is http (plain HTTP request), https (request inside an
	// intercepted TLS connection), tls (a spliced TLS connection) or dns
	// (a query to the daemon's resolver; Host is the name).
	Kind    string `json:"kind"`
	Host    string `json:"host,omitempty"`
	Type    string `json:"type,omitempty"` // DNS record type, for dns
	Dest    string `json:"dest"`           // original destination address:port; empty for dns
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason"`
	// Rules names the header-injection and AWS rules applied (never their values).
	Rules []string `json:"rules,omitempty"`
}

// Report is a sandbox's egress log: counters since it was attached and
// the most recent events, oldest first.
type Report struct {
	Mode        string `json:"mode"`
	Allowed     uint64 `json:"allowed"`
	Denied      uint64 `json:"denied"`
	Intercepted uint64 `json:"intercepted"`
	// RawIPRejected counts packets the packet filter rejected (traffic
	// that does not go through the proxy: other ports, UDP, ICMP).
	RawIPRejected uint64  `json:"raw_ip_rejected"`
	Events        []Event `json:"events"`
	// DNS is the sandbox's name lookups through the daemon's resolver,
	// kept apart so chatty lookups do not push connections out of Events.
	DNS DNSLog `json:"dns"`
}

// DNSLog counts a sandbox's DNS queries (answered or refused) and keeps
// the most recent, oldest first.
type DNSLog struct {
	Allowed uint64  `json:"allowed"`
	Denied  uint64  `json:"denied"`
	Queries []Event `json:"queries"`
}

// maxEvents bounds each sandbox's in-memory event list.
const maxEvents = 256

// eventLog is a bounded ring of events with counters; safe for concurrent use.
type eventLog struct {
	meter                        Meter // set at creation, never changed; nil counts nothing
	mu                           sync.Mutex
	allowed, denied, intercepted uint64
	ring                         []Event
	next                         int
}

func (l *eventLog) add(e Event, intercepted bool) {
	if l.meter != nil {
		l.meter.Egress(e.Kind, e.Allowed)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Allowed {
		l.allowed++
	} else {
		l.denied++
	}
	if intercepted {
		l.intercepted++
	}
	if len(l.ring) < maxEvents {
		l.ring = append(l.ring, e)
		return
	}
	l.ring[l.next] = e
	l.next = (l.next + 1) % maxEvents
}

func (l *eventLog) report() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Allowed: l.allowed, Denied: l.denied, Intercepted: l.intercepted, Events: make([]Event, 0, len(l.ring))}
	r.Events = append(r.Events, l.ring[l.next:]...)
	r.Events = append(r.Events, l.ring[:l.next]...)
	return r
}
