package e2e

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	name string
	data map[string]any
}

// sseCall POSTs body to the sandbox's dataplane path and returns the
// response (the caller reads events with nextEvent and closes it).
func sseCall(t *testing.T, d *daemon, sb *protocol.Sandbox, path string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, sb.DataplaneURL+path, bytes.NewReader(b))
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// nextEvent reads the next event, skipping comments; ok is false at EOF.
func nextEvent(t *testing.T, r *bufio.Reader) (ev sseEvent, ok bool) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return ev, false
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "":
			if ev.name != "" {
				return ev, true
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev.data); err != nil {
				t.Fatalf("event %s: bad data %q: %v", ev.name, line, err)
			}
		}
	}
}

// sseRun is the client's loop: start, then resume at its offsets whenever
// a response ends with ack_required, until exit. It returns stdout,
// stderr, the exit code and how many responses it took.
func sseRun(t *testing.T, d *daemon, sb *protocol.Sandbox, start protocol.ExecStreamStartRequest) (stdout, stderr string, code, responses int) {
	t.Helper()
	var out [2]bytes.Buffer
	offsets := map[string]int64{"stdout": 0, "stderr": 0}
	resp := sseCall(t, d, sb, "/execute/stream/start", start)
	for {
		responses++
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("response %d: %d %s", responses, resp.StatusCode, b)
		}
		r := bufio.NewReader(resp.Body)
		acked := false
		for !acked {
			ev, ok := nextEvent(t, r)
			if !ok {
				t.Fatalf("response %d ended without exit or ack_required", responses)
			}
			switch ev.name {
			case "stdout", "stderr":
				data, _ := base64.StdEncoding.DecodeString(ev.data["data"].(string))
				if off := int64(ev.data["offset"].(float64)); off != offsets[ev.name] {
					t.Fatalf("%s chunk at offset %d, want %d (lost or repeated output)", ev.name, off, offsets[ev.name])
				}
				offsets[ev.name] += int64(len(data))
				out[map[string]int{"stdout": 0, "stderr": 1}[ev.name]].Write(data)
			case "exit":
				resp.Body.Close()
				return out[0].String(), out[1].String(), int(ev.data["exit_code"].(float64)), responses
			case "ack_required":
				acked = true
			case "error":
				t.Fatalf("error event: %v", ev.data)
			}
		}
		resp.Body.Close()
		resp = sseCall(t, d, sb, "/execute/stream/resume", protocol.ExecStreamResumeRequest{
			CommandID: start.CommandID, StdoutOffset: offsets["stdout"], StderrOffset: offsets["stderr"]})
	}
}

// TestSSEExec drives the SSE exec transport of the newest clients: events
// of a short command, the ack_required loop over 20 MB of output, a resume
// after a dropped response, a retried start that must not run twice, and
// the refusals.
func TestSSEExec(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	sn := readySnapshot(t, d.Client, "sse", testImage(t))
	sb := newSandbox(t, d.Client, sn.ID, nil)

	stdout, stderr, code, _ := sseRun(t, d, sb, protocol.ExecStreamStartRequest{
		Command: "echo hello; echo oops >&2; exit 3", CommandID: uuid.NewString(), Shell: "/bin/sh"})
	if stdout != "hello\n" || stderr != "oops\n" || code != 3 {
		t.Fatalf("got %q %q exit %d", stdout, stderr, code)
	}

	const big = 20_000_000
	stdout, _, code, responses := sseRun(t, d, sb, protocol.ExecStreamStartRequest{
		Command: "head -c 20000000 /dev/zero | tr '\\0' a", CommandID: uuid.NewString(), Shell: "/bin/sh"})
	if code != 0 || len(stdout) != big || strings.Trim(stdout, "a") != "" {
		t.Fatalf("20 MB: exit %d, %d bytes", code, len(stdout))
	}
	if responses < 3 {
		t.Fatalf("20 MB arrived in %d responses: the server never asked for an ack", responses)
	}

	// A response dropped mid-command: resume from what arrived.
	id := uuid.NewString()
	resp := sseCall(t, d, sb, "/execute/stream/start", protocol.ExecStreamStartRequest{
		Command: "for i in 1 2 3 4 5; do echo $i; sleep 0.2; done", CommandID: id, Shell: "/bin/sh"})
	r := bufio.NewReader(resp.Body)
	var got string
	for got == "" {
		ev, ok := nextEvent(t, r)
		if !ok {
			t.Fatal("no output before the drop")
		}
		if ev.name == "stdout" {
			b, _ := base64.StdEncoding.DecodeString(ev.data["data"].(string))
			got = string(b)
		}
	}
	resp.Body.Close()
	time.Sleep(300 * time.Millisecond)
	resp = sseCall(t, d, sb, "/execute/stream/resume", protocol.ExecStreamResumeRequest{CommandID: id, StdoutOffset: int64(len(got))})
	r = bufio.NewReader(resp.Body)
	for {
		ev, ok := nextEvent(t, r)
		if !ok {
			t.Fatal("resumed response ended without exit")
		}
		if ev.name == "stdout" {
			b, _ := base64.StdEncoding.DecodeString(ev.data["data"].(string))
			got += string(b)
		}
		if ev.name == "exit" {
			break
		}
	}
	resp.Body.Close()
	if got != "1\n2\n3\n4\n5\n" {
		t.Fatalf("output across the drop: %q", got)
	}

	// The same command_id twice runs the command once.
	id = uuid.NewString()
	for range 2 {
		sseRun(t, d, sb, protocol.ExecStreamStartRequest{Command: "echo run >> /tmp/runs", CommandID: id, Shell: "/bin/sh"})
	}
	if out := mustRun(t, d.Client, sb.Name, "cat /tmp/runs"); out != "run\n" {
		t.Fatalf("a retried start ran the command again: %q", out)
	}

	// A daemon shutting down ends the response with a resumable error;
	// the command runs on, and the next daemon resumes it.
	id = uuid.NewString()
	resp = sseCall(t, d, sb, "/execute/stream/start", protocol.ExecStreamStartRequest{
		Command: "echo before; sleep 2; echo after", CommandID: id, Shell: "/bin/sh"})
	r = bufio.NewReader(resp.Body)
	if ev, ok := nextEvent(t, r); !ok || ev.name != "started" {
		t.Fatalf("first event %+v", ev)
	}
	stopped := make(chan struct{})
	go func() { d.stop(); close(stopped) }()
	var last sseEvent
	for {
		ev, ok := nextEvent(t, r)
		if !ok {
			break
		}
		last = ev
	}
	resp.Body.Close()
	<-stopped
	if last.name != "error" || last.data["error_type"] != protocol.ErrServerShuttingDown {
		t.Fatalf("last event before shutdown: %+v, want a ServerShuttingDown error", last)
	}
	d.restart()
	stdout, _, code, _ = sseRun(t, d, sb, protocol.ExecStreamStartRequest{CommandID: id, Command: "echo before; sleep 2; echo after", Shell: "/bin/sh"})
	if stdout != "before\nafter\n" || code != 0 {
		t.Fatalf("resumed across a daemon restart: %q exit %d", stdout, code)
	}

	resp = sseCall(t, d, sb, "/execute/stream/resume", protocol.ExecStreamResumeRequest{CommandID: "no-such-command"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("resume of an unknown command: %d, want 404", resp.StatusCode)
	}
	resp = sseCall(t, d, sb, "/execute/stream/start", map[string]any{"command": "true", "pty": true})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(body), "pty") {
		t.Fatalf("start with pty: %d %s, want a 422 naming it", resp.StatusCode, body)
	}
}
