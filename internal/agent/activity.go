package agent

import (
	"context"
	"net/http"
	"time"
)

// Activity is the agent's answer to GET /v1/activity: what the daemon's
// idle-TTL reaper needs to know about commands it may not be relaying
// (e.g. started with wait:false and then left with no client attached).
//
// Running > 0 means a command is still running, and ChangedMsAgo says when
// a command last started, wrote output or finished. Both count as
// activity; the daemon polls only when its own clock says the sandbox is
// due to stop, so an idle sandbox is never woken for it.
type Activity struct {
	// Running counts commands whose process has not exited.
	Running int `json:"running"`
	// Sessions counts commands the agent still remembers (running, or
	// finished within their ttl_seconds).
	Sessions int `json:"sessions"`
	// OutputBytes is the total output produced by the remembered commands,
	// counting bytes already dropped from their replay windows.
	OutputBytes int64 `json:"output_bytes"`
	// ChangedMsAgo is how many milliseconds ago a command last started,
	// wrote output or finished (the agent's monotonic clock, so skew
	// between guest and host clocks does not matter); absent when no
	// command ran since the agent started.
	ChangedMsAgo *int64 `json:"changed_ms_ago,omitempty"`
}

// activity snapshots the session table. It only reads existing state.
func (t *sessionTable) activity() Activity {
	t.mu.Lock()
	live := make([]*session, 0, len(t.live))
	for _, s := range t.live {
		live = append(live, s)
	}
	changed := t.expiredChange
	t.mu.Unlock()
	a := Activity{Sessions: len(live)}
	for _, s := range live {
		started := true
		select {
		case <-s.ready:
		default:
			started = false
			a.Running++ // being started
		}
		s.mu.Lock()
		if s.changeAt.After(changed) {
			changed = s.changeAt
		}
		if started && s.startErr == nil {
			if !s.done {
				a.Running++
			}
			a.OutputBytes += s.out[streamStdout].end() + s.out[streamStderr].end()
		}
		s.mu.Unlock()
	}
	if !changed.IsZero() {
		ago := time.Since(changed).Milliseconds()
		a.ChangedMsAgo = &ago
	}
	return a
}

// handleActivity serves GET /v1/activity.
func (s *Server) handleActivity(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.sessions.activity())
}

// Activity asks the agent about its commands. An agent without the
// endpoint answers an *HTTPError with Status 404.
func (c *Client) Activity(ctx context.Context) (Activity, error) {
	var a Activity
	err := c.getJSON(ctx, http.MethodGet, "/v1/activity", nil, nil, &a)
	return a, err
}
