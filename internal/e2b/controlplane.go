package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// routeControlPlane registers the E2B control plane, at both the paths
// the current SDKs use (/v2/sandboxes) and the older ones.
func (d *Door) routeControlPlane() {
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		d.mux.HandleFunc("POST "+p, d.control(http.StatusCreated, d.createSandbox))
		d.mux.HandleFunc("GET "+p, d.listSandboxes)
		d.mux.HandleFunc("POST "+p+"/{id}/connect", d.control(http.StatusOK, d.connectSandbox))
	}
	d.mux.HandleFunc("GET /sandboxes/{id}", d.control(http.StatusOK, d.getSandbox))
	d.mux.HandleFunc("DELETE /sandboxes/{id}", d.control(http.StatusNoContent, d.killSandbox))
	d.mux.HandleFunc("POST /sandboxes/{id}/timeout", d.control(http.StatusNoContent, d.setTimeout))
	d.mux.HandleFunc("POST /sandboxes/{id}/pause", d.control(http.StatusNoContent, d.pauseSandbox))
	d.mux.HandleFunc("POST /sandboxes/{id}/resume", d.control(http.StatusCreated, d.resumeSandbox))
	d.mux.HandleFunc("GET /templates", d.control(http.StatusOK, d.listTemplates))
}

// apiError is an E2B API error body; the SDKs read code and message.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return e.Message }

func badRequest(format string, args ...any) error {
	return &apiError{Code: http.StatusBadRequest, Message: fmt.Sprintf(format, args...)}
}

// toAPIError maps an error from the Cubicle API to the E2B status the
// SDKs turn into their error classes: 404 NotFoundError (or
// SandboxNotFoundError), 401 AuthenticationError, 429 RateLimitError, 409
// for "already paused"; Cubicle's 422 (bad input) is E2B's 400. Other
// statuses pass through (the SDKs' SandboxError carries them).
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var ce *cubicle.APIError
	if errors.As(err, &ce) {
		code := ce.Status
		if code == http.StatusUnprocessableEntity {
			code = http.StatusBadRequest
		}
		return &apiError{Code: code, Message: ce.Error()}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &apiError{Code: http.StatusGatewayTimeout, Message: err.Error()}
	}
	return &apiError{Code: http.StatusInternalServerError, Message: err.Error()}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

func writeAPIError(w http.ResponseWriter, err error) {
	ae := toAPIError(err)
	writeJSON(w, ae.Code, ae)
}

// call is one control-plane request: its caller's client, body and path id.
type call struct {
	c    *cubicle.Client
	key  string
	id   string
	body []byte
}

// decode reads the call's JSON body into v; an empty body leaves v as is.
// Unknown members are ignored: the SDKs add fields faster than servers
// learn them, and those the door cannot honour are checked by name.
func (c *call) decode(v any) error {
	if len(strings.TrimSpace(string(c.body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.body, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// control adapts a control-plane handler: it needs an API key, and its
// result is written with status (nothing for 204).
func (d *Door) control(status int, h func(ctx context.Context, c *call) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := controlKey(r.Header)
		if key == "" {
			writeAPIError(w, &apiError{Code: http.StatusUnauthorized, Message: "missing X-API-Key"})
			return
		}
		body, err := readBody(r)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		out, err := h(r.Context(), &call{c: d.client(key), key: key, id: r.PathValue("id"), body: body})
		if err != nil {
			writeAPIError(w, err)
			return
		}
		code := status
		if a, ok := out.(answer); ok {
			code, out = a.status, a.body
		}
		if code == http.StatusNoContent {
			w.WriteHeader(code)
			return
		}
		writeJSON(w, code, out)
	}
}

// maxControlBody bounds a control-plane request body.
const maxControlBody = 1 << 20

func readBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxControlBody))
	if err != nil {
		return nil, badRequest("read body: %v", err)
	}
	return b, nil
}

// answer is a result whose status differs from the route's usual one.
type answer struct {
	status int
	body   any
}

// createRequest is the body of POST /sandboxes (the SDKs' NewSandbox).
type createRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *network          `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
}

// network is the SDKs' egress configuration.
type network struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// DefaultTimeout is the SDKs' default sandbox timeout, in seconds.
const DefaultTimeout = 300

// e2bDefaultTemplate is the template the SDKs ask for when none is given;
// it boots the daemon's default snapshot.
const e2bDefaultTemplate = "base"

// createSandboxRequest maps an E2B create onto Cubicle's. The E2B timeout
// becomes the idle TTL, rounded up to the daemon's TTL granularity; a
// sandbox that reaches it is deleted (E2B's "kill"), unless autoPause asks
// for a stop that keeps it (and its memory, unless autoPauseMemory is
// false) instead.
func (d *Door) createSandboxRequest(in createRequest) (protocol.CreateSandboxRequest, error) {
	var out protocol.CreateSandboxRequest
	if !isNull(in.MCP) {
		return out, badRequest("mcp: MCP gateways are not supported by this server")
	}
	if !isNull(in.VolumeMounts) {
		return out, badRequest("volumeMounts: volumes are not supported by this server")
	}
	if in.TemplateID != e2bDefaultTemplate {
		out.Snapshot = in.TemplateID
	}
	timeout := int64(DefaultTimeout)
	if in.Timeout != nil {
		timeout = *in.Timeout
	}
	ttl, err := d.ttlSeconds(timeout)
	if err != nil {
		return out, err
	}
	out.IdleTTLSeconds = &ttl
	action := onKill
	if in.AutoPause != nil && *in.AutoPause {
		action = onPause
		if in.AutoPauseMemory != nil && !*in.AutoPauseMemory {
			action = onPauseFS
		}
	}
	lc := d.lifecycle(action)
	out.PreserveMemoryOnStop, out.DeleteAfterStopSeconds = lc.PreserveMemoryOnStop, lc.DeleteAfterStopSeconds
	if _, ok := in.Metadata[onTimeoutLabel]; ok {
		return out, badRequest("metadata: %s is reserved", onTimeoutLabel)
	}
	out.Labels = map[string]string{onTimeoutLabel: action}
	maps.Copy(out.Labels, in.Metadata)
	out.EnvVars = in.EnvVars
	proxy, err := egressConfig(in.AllowInternetAccess, in.Network)
	if err != nil {
		return out, err
	}
	out.ProxyConfig = proxy
	return out, nil
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

// ttlSeconds rounds an E2B timeout (seconds) up to the TTL granularity.
func (d *Door) ttlSeconds(timeout int64) (int64, error) {
	if timeout <= 0 {
		return 0, badRequest("timeout: must be a positive number of seconds")
	}
	g := int64(d.cfg.TTLGranularity / time.Second)
	if g < 1 {
		g = 1
	}
	return (timeout + g - 1) / g * g, nil
}

// egressConfig maps E2B's egress options onto an access_control list:
// allow_internet_access false (or denyOut 0.0.0.0/0) allows only allowOut;
// denyOut alone denies its entries.
func egressConfig(allowInternet *bool, n *network) (json.RawMessage, error) {
	var ac protocol.AccessControl
	closed := allowInternet != nil && !*allowInternet
	switch {
	case n != nil && len(n.AllowOut) > 0:
		ac.AllowList = n.AllowOut
	case n != nil && slices.Contains(n.DenyOut, "0.0.0.0/0"):
		closed = true
	case n != nil && len(n.DenyOut) > 0 && !closed:
		ac.DenyList = n.DenyOut
	case !closed:
		return nil, nil
	}
	if ac.AllowList == nil && ac.DenyList == nil {
		// An empty allow list allows nothing.
		b, err := json.Marshal(map[string]any{"access_control": map[string][]string{"allow_list": {}}})
		return b, err
	}
	b, err := json.Marshal(protocol.ProxyConfig{AccessControl: &ac})
	return b, err
}

// sandboxCreated is the SDKs' Sandbox: what create, resume and connect
// answer. envdAccessToken is the caller's own key, which the SDK sends
// back on every envd request as X-Access-Token.
type sandboxCreated struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	Alias              string  `json:"alias,omitempty"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// clientID is the constant the SDKs' clientID field carries.
const clientID = "cubicle"

func created(sb *protocol.Sandbox, key string) sandboxCreated {
	return sandboxCreated{SandboxID: sb.Name, TemplateID: sb.SnapshotID, ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: key}
}

func (d *Door) createSandbox(ctx context.Context, c *call) (any, error) {
	var in createRequest
	if err := c.decode(&in); err != nil {
		return nil, err
	}
	req, err := d.createSandboxRequest(in)
	if err != nil {
		return nil, err
	}
	sb, err := c.c.CreateSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	return created(sb, c.key), nil
}

// listedSandbox is the SDKs' ListedSandbox and, with the detail fields,
// SandboxDetail.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// E2B sandbox states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// e2bState is the E2B state of a Cubicle status; "" for sandboxes E2B has
// no word for (failed, deleting), which lists leave out.
func e2bState(status string) string {
	switch status {
	case protocol.StatusReady, protocol.StatusProvisioning:
		return stateRunning
	case protocol.StatusStopped:
		return statePaused
	}
	return ""
}

// listed maps a sandbox. endAt is when its idle TTL would fire counting
// from its last update: Cubicle's timeout restarts with activity.
func listed(sb *protocol.Sandbox) listedSandbox {
	started := sb.CreatedAt
	end := sb.UpdatedAt.Add(time.Duration(sb.IdleTTLSeconds) * time.Second)
	return listedSandbox{SandboxID: sb.Name, TemplateID: sb.SnapshotID, ClientID: clientID, StartedAt: started, EndAt: end,
		CPUCount: sb.VCPUs, MemoryMB: sb.MemBytes >> 20, DiskSizeMB: sb.FSCapacityBytes >> 20, Metadata: metadata(sb.Labels),
		State: e2bState(sb.Status), EnvdVersion: EnvdVersion}
}

// metadata is a sandbox's labels without the door's own.
func metadata(labels map[string]string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	delete(out, onTimeoutLabel)
	return out
}

func (d *Door) getSandbox(ctx context.Context, c *call) (any, error) {
	sb, err := c.c.GetSandbox(ctx, c.id)
	if err != nil {
		return nil, err
	}
	return listed(sb), nil
}

// maxListed bounds one list page.
const maxListed = 1000

// listSandboxes serves GET /sandboxes: metadata filters become label
// filters, state filters apply to the mapped states, nextToken is
// Cubicle's cursor (answered in the x-next-token header).
func (d *Door) listSandboxes(w http.ResponseWriter, r *http.Request) {
	d.control(http.StatusOK, func(ctx context.Context, c *call) (any, error) {
		opts, states, err := listOptions(r.URL.Query())
		if err != nil {
			return nil, err
		}
		l, err := c.c.ListSandboxes(ctx, opts)
		if err != nil {
			return nil, err
		}
		out := []listedSandbox{}
		for i := range l.Sandboxes {
			ls := listed(&l.Sandboxes[i])
			if ls.State != "" && (len(states) == 0 || slices.Contains(states, ls.State)) {
				out = append(out, ls)
			}
		}
		if l.NextCursor != nil && *l.NextCursor != "" {
			w.Header().Set("X-Next-Token", *l.NextCursor)
		}
		return out, nil
	})(w, r)
}

// listOptions maps the SDKs' list query onto Cubicle's.
func listOptions(q url.Values) (cubicle.ListOptions, []string, error) {
	opts := cubicle.ListOptions{Limit: 100, Cursor: q.Get("nextToken")}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListed {
			return opts, nil, badRequest("limit: must be between 1 and %d", maxListed)
		}
		opts.Limit = n
	}
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			return opts, nil, badRequest("metadata: %v", err)
		}
		// The SDKs encode each key and value before encoding the pairs.
		for k, vs := range pairs {
			for _, v := range vs {
				ku, err1 := url.QueryUnescape(k)
				vu, err2 := url.QueryUnescape(v)
				if err := errors.Join(err1, err2); err != nil {
					return opts, nil, badRequest("metadata: %v", err)
				}
				opts.Labels = append(opts.Labels, ku+"="+vu)
			}
		}
		slices.Sort(opts.Labels)
	}
	var states []string
	for _, s := range q["state"] {
		for _, st := range strings.Split(s, ",") {
			if st != stateRunning && st != statePaused {
				return opts, nil, badRequest("state: %q is not running or paused", st)
			}
			states = append(states, st)
		}
	}
	return opts, states, nil
}

func (d *Door) killSandbox(ctx context.Context, c *call) (any, error) {
	return nil, c.c.DeleteSandbox(ctx, c.id)
}

// template is the SDKs' Template, for a snapshot.
type template struct {
	TemplateID  string    `json:"templateID"`
	BuildID     string    `json:"buildID"`
	CPUCount    int64     `json:"cpuCount"`
	MemoryMB    int64     `json:"memoryMB"`
	DiskSizeMB  int64     `json:"diskSizeMB"`
	Public      bool      `json:"public"`
	Aliases     []string  `json:"aliases"`
	Names       []string  `json:"names"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	EnvdVersion string    `json:"envdVersion"`
	BuildStatus string    `json:"buildStatus"`
}

// buildStatus is the E2B build status of a snapshot status.
func buildStatus(status string) string {
	switch status {
	case protocol.SnapshotReady:
		return "ready"
	case protocol.SnapshotFailed:
		return "error"
	}
	return "building"
}

// listTemplates serves GET /templates: the snapshots the key can see, by
// id with their name as the alias (either boots them).
func (d *Door) listTemplates(ctx context.Context, c *call) (any, error) {
	l, err := c.c.ListSnapshots(ctx, cubicle.ListOptions{Limit: maxListed})
	if err != nil {
		return nil, err
	}
	out := []template{}
	for _, sn := range l.Snapshots {
		out = append(out, template{TemplateID: sn.ID, BuildID: sn.ID, DiskSizeMB: sn.FSCapacityBytes >> 20, Public: sn.Builtin,
			Aliases: []string{sn.Name}, Names: []string{sn.Name}, CreatedAt: sn.CreatedAt, UpdatedAt: sn.UpdatedAt,
			EnvdVersion: EnvdVersion, BuildStatus: buildStatus(sn.Status)})
	}
	return out, nil
}
