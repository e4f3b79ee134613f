package agent

import (
	"context"
	"net/http"
)

// Activity is the agent's answer to GET /v1/activity: what the daemon's
// idle-TTL reaper needs to know about commands it may not be relaying
// (e.g. started with wait:false and then left with no client attached).
//
// The daemon compares successive answers: a change in Sessions or
// OutputBytes means a command started, finished or wrote output since the
// last poll, and Running > 0 means a command is still running. Both count
// as activity.
type Activity struct {
	// Running counts commands whose process has not exited.
	Running int `json:"running"`
	// Sessions counts commands the agent still remembers (running, or
	// finished within their ttl_seconds).
	Sessions int `json:"sessions"`
	// OutputBytes is the total output produced by the remembered commands,
	// counting bytes already dropped from their replay windows.
	OutputBytes int64 `json:"output_bytes"`
}

// activity snapshots the session table. It only reads existing state.
func (t *sessionTable) activity() Activity {
	t.mu.Lock()
	live := make([]*session, 0, len(t.live))
	for _, s := range t.live {
		live = append(live, s)
	}
	t.mu.Unlock()
	a := Activity{Sessions: len(live)}
	for _, s := range live {
		select {
		case <-s.ready:
		default:
			a.Running++ // being started
			continue
		}
		if s.startErr != nil {
			continue
		}
		s.mu.Lock()
		if !s.done {
			a.Running++
		}
		a.OutputBytes += s.out[streamStdout].end() + s.out[streamStderr].end()
		s.mu.Unlock()
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
