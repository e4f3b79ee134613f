package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// percentiles reports p50 and p95 of ds in milliseconds.
func percentiles(b *testing.B, ds []time.Duration) (p50, p95 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	p50 = float64(ds[len(ds)/2].Microseconds()) / 1000
	p95 = float64(ds[(len(ds)*95)/100].Microseconds()) / 1000
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p95, "p95-ms")
	b.ReportMetric(0, "ns/op") // the percentiles are the result
	return p50, p95
}

// BenchmarkCreateToFirstOutput measures, per driver, POST /boxes (waiting
// for ready) until the first byte of `echo hi` arrives over the WebSocket.
func BenchmarkCreateToFirstOutput(b *testing.B) {
	ref := testImage(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d := startDaemon(b, rt, "")
			sn := readySnapshot(b, d.Client, "bench", ref)
			ctx := context.Background()
			var ds []time.Duration
			for b.Loop() {
				t0 := time.Now()
				sb, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID})
				if err != nil {
					b.Fatal(err)
				}
				first := &firstByte{}
				if _, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "echo hi", Shell: "/bin/sh", Stdout: first}); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, first.at.Sub(t0))
				b.StopTimer()
				if err := d.Client.DeleteSandbox(ctx, sb.Name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			percentiles(b, ds)
		})
	}
}

// firstByte records when the first output byte arrived.
type firstByte struct{ at time.Time }

func (f *firstByte) Write(p []byte) (int, error) {
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	return len(p), nil
}

// BenchmarkExecRoundTrip measures, per driver, one `true` over the
// WebSocket exec path through the daemon (client → daemon → agent → exit).
func BenchmarkExecRoundTrip(b *testing.B) {
	ref := testImage(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d := startDaemon(b, rt, "")
			sn := readySnapshot(b, d.Client, "bench", ref)
			sb := newSandbox(b, d.Client, sn.ID, nil)
			ctx := context.Background()
			var ds []time.Duration
			for b.Loop() {
				t0 := time.Now()
				code, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "true", Shell: "/bin/sh", Stdout: io.Discard})
				ds = append(ds, time.Since(t0))
				if err != nil || code != 0 {
					b.Fatalf("true: %d %v", code, err)
				}
			}
			percentiles(b, ds)
		})
	}
}

// BenchmarkBareRunsc is the baseline: `runsc --platform=systrap run` of the
// same test image running `echo hi`, no daemon, no network.
func BenchmarkBareRunsc(b *testing.B) {
	ref := testImage(b)
	_, runsc := binaries(b)
	st, err := image.NewStore(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	img, err := st.Resolve(context.Background(), ref, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	if len(img.Layers) != 1 {
		b.Fatalf("test image has %d layers, want 1", len(img.Layers))
	}
	bundle := b.TempDir()
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: img.Layers[0], Readonly: true},
		Process: &specs.Process{Args: []string{"/bin/sh", "-c", "echo hi"}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		}},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(b.TempDir(), "runsc")
	b.Cleanup(func() { unmountUnder(filepath.Dir(root)) })
	var ds []time.Duration
	for b.Loop() {
		id := make([]byte, 16)
		rand.Read(id)
		t0 := time.Now()
		out, err := exec.Command(runsc, "--root", root, "--platform=systrap", "--network=none", "run", "--bundle", bundle, hex.EncodeToString(id)).CombinedOutput()
		ds = append(ds, time.Since(t0))
		if err != nil || strings.TrimSpace(string(out)) != "hi" {
			b.Fatalf("runsc run: %v: %s", err, out)
		}
	}
	percentiles(b, ds)
}
