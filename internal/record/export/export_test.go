package export

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func event(seq int64, pad int) protocol.AuditEvent {
	data, _ := json.Marshal(map[string]string{"pad": strings.Repeat("x", pad)})
	return protocol.AuditEvent{Seq: seq, Time: time.Unix(1700000000, 0).UTC(), SandboxID: "sb", WorkspaceID: "w",
		Actor: protocol.Actor{User: protocol.ActorSystem}, Kind: protocol.KindNetwork, Type: protocol.EventNetworkHTTP, Data: data}
}

// TestJSONLRotates writes 3.5 MiB of events with 1 MiB files, 3 kept:
// the directory holds the live file and 2 rotated ones, each ≤ 1 MiB and
// made of whole JSON lines, and the newest events are all there in order.
func TestJSONLRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	j, err := NewJSONL(path, 1, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3500
	for i := range n / 100 {
		var evs []protocol.AuditEvent
		for k := range 100 {
			evs = append(evs, event(int64(i*100+k+1), 1000))
		}
		j.Export(evs)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "audit*.jsonl"))
	if len(files) != 3 {
		t.Fatalf("files %v, want the live one and 2 rotated", files)
	}
	var last int64
	for _, f := range files {
		st, _ := os.Stat(f)
		if st.Size() > 1<<20 {
			t.Fatalf("%s is %d bytes, past the 1 MiB bound", f, st.Size())
		}
		fh, _ := os.Open(f)
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev protocol.AuditEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("%s: a line that is not an event: %v", f, err)
			}
			if f == path {
				last = max(last, ev.Seq)
			}
		}
		fh.Close()
	}
	if last != n {
		t.Fatalf("the live file ends at seq %d, want %d", last, n)
	}
}

func TestParseTarget(t *testing.T) {
	if _, p, err := ParseTarget("jsonl:/var/log/a.jsonl"); err != nil || p != "/var/log/a.jsonl" {
		t.Fatalf("jsonl: %q %v", p, err)
	}
	for _, bad := range []string{"jsonl:", "/x", "syslog:/x"} {
		if _, _, err := ParseTarget(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

func TestOTelEnabled(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		env  func(string) string
		want bool
	}{
		{env(), false},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), true},
		{env("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://c:4318/v1/logs"), true},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_LOGS_EXPORTER", "none"), false},
		{env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_SDK_DISABLED", "true"), false},
	} {
		if got := OTelEnabled(c.env); got != c.want {
			t.Fatalf("OTelEnabled = %v, want %v", got, c.want)
		}
	}
}

// TestOTelSendsToTheConfiguredEndpoint points the standard variable at a
// collector stand-in and checks the events arrive as an OTLP logs export
// carrying the event JSON.
func TestOTelSendsToTheConfiguredEndpoint(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var bodies []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		bodies = append(bodies, b...)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", srv.URL+"/v1/logs")
	o, err := NewOTel(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	o.Export([]protocol.AuditEvent{event(7, 10)})
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) == 0 || paths[0] != "/v1/logs" {
		t.Fatalf("collector got %v", paths)
	}
	for _, want := range []string{`"type":"network.http"`, "cubicle.sandbox_id", "network.http"} {
		if !strings.Contains(string(bodies), want) {
			t.Fatalf("export lacks %q", want)
		}
	}
}
