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

// benchSandbox starts a daemon on runtime rt with one ready sandbox of ref.
func benchSandbox(b *testing.B, rt, ref string) (*daemon, *protocol.Sandbox) {
	d := startDaemon(b, rt, "")
	sn := readySnapshot(b, d.Client, "bench", ref)
	return d, newSandbox(b, d.Client, sn.ID, nil)
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
			d, sb := benchSandbox(b, rt, ref)
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
	img, err := st.Resolve(context.Background(), "bench", ref, nil, nil)
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

// BenchmarkStopStart measures, per driver, POST /stop then POST /start
// until the first byte of `echo hi` arrives (the sandbox's files persist
// across the cycle; the start is a cold boot on the same upper dir).
func BenchmarkStopStart(b *testing.B) {
	ref := testImage(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d, sb := benchSandbox(b, rt, ref)
			ctx := context.Background()
			var ds []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := d.Client.StopSandbox(ctx, sb.Name); err != nil {
					b.Fatal(err)
				}
				if err := d.Client.StartSandbox(ctx, sb.Name); err != nil {
					b.Fatal(err)
				}
				first := &firstByte{}
				if _, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "echo hi", Shell: "/bin/sh", Stdout: first}); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, first.at.Sub(t0))
			}
			percentiles(b, ds)
		})
	}
}

// BenchmarkCatThroughput streams `cat` of a 100 MiB file over the WebSocket
// exec path and reports MB/s, next to `cat` of the same bytes on the host
// (to /dev/null through a pipe) measured in the same run.
func BenchmarkCatThroughput(b *testing.B) {
	const size = 100 << 20
	ref := testImage(b)
	hostFile := filepath.Join(b.TempDir(), "100m")
	if err := os.WriteFile(hostFile, []byte(strings.Repeat("0123456789abcdef", size/16)), 0o644); err != nil {
		b.Fatal(err)
	}
	b.Run("host", func(b *testing.B) {
		var mbs []float64
		for b.Loop() {
			t0 := time.Now()
			cmd := exec.Command("cat", hostFile)
			cmd.Stdout = io.Discard
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			mbs = append(mbs, float64(size)/1e6/time.Since(t0).Seconds())
		}
		reportMedian(b, mbs, "MB/s")
	})
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d, sb := benchSandbox(b, rt, ref)
			ctx := context.Background()
			mustRun(b, d.Client, sb.Name, "head -c 104857600 /dev/zero | tr '\\0' a > /tmp/100m")
			var mbs []float64
			for b.Loop() {
				cw := &countWriter{}
				t0 := time.Now()
				code, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "cat /tmp/100m", Shell: "/bin/sh", Stdout: cw})
				if err != nil || code != 0 || cw.n != size {
					b.Fatalf("cat: code %d err %v, %d bytes", code, err, cw.n)
				}
				mbs = append(mbs, float64(size)/1e6/time.Since(t0).Seconds())
			}
			reportMedian(b, mbs, "MB/s")
		})
	}
}

type countWriter struct{ n int }

func (c *countWriter) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// reportMedian reports the median of vs under unit.
func reportMedian(b *testing.B, vs []float64, unit string) {
	if len(vs) == 0 {
		return
	}
	slices.Sort(vs)
	b.ReportMetric(vs[len(vs)/2], unit)
	b.ReportMetric(0, "ns/op")
}
