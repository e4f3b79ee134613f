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
			var ds, creates []time.Duration
			for b.Loop() {
				total, create := createToFirstOutput(b, d.Client, sn.ID)
				ds, creates = append(ds, total), append(creates, create)
			}
			percentiles(b, ds)
			b.ReportMetric(ms(median(creates)), "create-ms")
			reportPhases(b, d.logs.String())
		})
	}
}

// createToFirstOutput creates a sandbox of snapshot sn and returns the
// time until the first byte of its `echo hi` arrived and, of that, the
// time until the create answered; deleting it is not timed.
func createToFirstOutput(b *testing.B, c *cubicle.Client, sn string) (total, create time.Duration) {
	ctx := context.Background()
	t0 := time.Now()
	sb, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn})
	if err != nil {
		b.Fatal(err)
	}
	create = time.Since(t0)
	first := &firstByte{}
	if _, err := c.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "echo hi", Shell: "/bin/sh", Stdout: first}); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	defer b.StartTimer()
	if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
		b.Fatal(err)
	}
	return first.at.Sub(t0), create
}

// bootPhases are the phases the daemon's "sandbox ready" log line times,
// in the order they are reported.
var bootPhases = []string{"boot", "queue", "claim", "rootfs", "network", "egress", "driver", "agent"}

// bootPhaseDurations collects each boot phase's durations over the
// "sandbox ready" lines of a daemon's log after the first skip.
func bootPhaseDurations(logs string, skip int) map[string][]time.Duration {
	per := map[string][]time.Duration{}
	for line := range strings.Lines(logs) {
		if !strings.Contains(line, `msg="sandbox ready"`) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		for f := range strings.FieldsSeq(line) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || !slices.Contains(bootPhases, k) {
				continue
			}
			if d, err := time.ParseDuration(v); err == nil {
				per[k] = append(per[k], d)
			}
		}
	}
	return per
}

// reportPhases reports the median of each boot phase over the "sandbox
// ready" lines in a daemon's log, in milliseconds: where a create's time
// goes inside the daemon.
func reportPhases(b *testing.B, logs string) {
	per := bootPhaseDurations(logs, 0)
	for _, k := range bootPhases {
		if len(per[k]) > 0 {
			b.ReportMetric(ms(median(per[k])), k+"-ms")
		}
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
// same test image running `echo hi`, no daemon. nonet runs it with
// --network=none; netns with --network=sandbox in a network namespace of
// its own with a veth and an address, as every Cubicle sandbox has (the
// namespace is made before the clock starts, so the baseline is, if
// anything, flattered).
func BenchmarkBareRunsc(b *testing.B) {
	layer := bareLayer(b)
	for _, network := range []string{"nonet", "netns"} {
		b.Run(network, func(b *testing.B) {
			var ds []time.Duration
			for b.Loop() {
				ds = append(ds, bareRun(b, layer, network == "netns"))
			}
			percentiles(b, ds)
		})
	}
}

// BenchmarkColdVsBareRunsc alternates a gVisor create → first output of
// `echo hi` through the daemon with a bare runsc run in a fresh netns
// (BenchmarkBareRunsc/netns), so both see the same machine load, and
// reports both medians, their ratio and the daemon's boot phases.
func BenchmarkColdVsBareRunsc(b *testing.B) {
	layer := bareLayer(b)
	d := startDaemon(b, "gvisor", "")
	sn := readySnapshot(b, d.Client, "bench", testImage(b))
	var cold, creates, bare []time.Duration
	for b.Loop() {
		bare = append(bare, bareRun(b, layer, true))
		total, create := createToFirstOutput(b, d.Client, sn.ID)
		cold, creates = append(cold, total), append(creates, create)
	}
	c, r := ms(median(cold)), ms(median(bare))
	b.ReportMetric(c, "cold-p50-ms")
	b.ReportMetric(ms(median(creates)), "create-ms")
	b.ReportMetric(r, "bare-p50-ms")
	b.ReportMetric(c/r, "ratio")
	b.ReportMetric(0, "ns/op")
	reportPhases(b, d.logs.String())
}

// bareLayer is the test image's one layer, unpacked, for bare runsc runs.
func bareLayer(tb testing.TB) string {
	st, err := image.NewStore(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	img, err := st.Resolve(context.Background(), "bench", testImage(tb), nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if len(img.Layers) != 1 {
		tb.Fatalf("test image has %d layers, want 1", len(img.Layers))
	}
	return img.Layers[0]
}

// bareRun times one `runsc run` of `echo hi` on layer, in a fresh netns
// with --network=sandbox when netns is set, else with --network=none;
// the setup and teardown around it are not timed (nor, in a benchmark,
// counted on its timer). Tests use it for a baseline measured in the same
// run as what they compare with it.
func bareRun(tb testing.TB, layer string, netns bool) time.Duration {
	_, runsc := binaries(tb)
	timer(tb, false)
	ns, flag, del := "", "--network=none", func() {}
	if netns {
		ns, del = benchNetns(tb)
		flag = "--network=sandbox"
	}
	defer del()
	bundle := bareBundle(tb, layer, ns, "echo hi")
	root := filepath.Join(tb.TempDir(), "runsc")
	defer unmountUnder(filepath.Dir(root))
	id := make([]byte, 16)
	rand.Read(id)
	timer(tb, true)
	t0 := time.Now()
	out, err := exec.Command(runsc, "--root", root, "--platform=systrap", flag, "run", "--bundle", bundle, hex.EncodeToString(id)).CombinedOutput()
	took := time.Since(t0)
	timer(tb, false)
	if err != nil || strings.TrimSpace(string(out)) != "hi" {
		tb.Fatalf("runsc run: %v: %s", err, out)
	}
	defer timer(tb, true)
	return took
}

// timer starts or stops tb's timer when tb is a benchmark.
func timer(tb testing.TB, on bool) {
	if b, ok := tb.(*testing.B); ok {
		if on {
			b.StartTimer()
		} else {
			b.StopTimer()
		}
	}
}

// bareBundle writes an OCI bundle running command by /bin/sh on rootfs, in
// the network namespace at netns ("" for none).
func bareBundle(tb testing.TB, rootfs, netns, command string) string {
	bundle := tb.TempDir()
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Process: &specs.Process{Args: []string{"/bin/sh", "-c", command}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Mounts:  []specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		}},
	}
	if netns != "" {
		spec.Linux.Namespaces = append(spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns})
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		tb.Fatal(err)
	}
	return bundle
}

// benchNetns makes a fresh network namespace shaped like a sandbox's (a
// veth whose inside end is eth0 with a /30 address and a default route;
// TEST-NET-2, outside Cubicle's pool) and returns its path and a func
// deleting it (also run with the benchmark's cleanup).
func benchNetns(tb testing.TB) (string, func()) {
	id := make([]byte, 4)
	rand.Read(id)
	name := "cubbench" + hex.EncodeToString(id)
	host := "vb" + hex.EncodeToString(id)
	del := func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", name).Run()
	}
	tb.Cleanup(del)
	sh(tb, "ip", "netns", "add", name)
	sh(tb, "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name)
	sh(tb, "ip", "addr", "add", "198.51.100.1/30", "dev", host)
	sh(tb, "ip", "link", "set", host, "up")
	sh(tb, "ip", "-n", name, "addr", "add", "198.51.100.2/30", "dev", "eth0")
	sh(tb, "ip", "-n", name, "link", "set", "eth0", "up")
	sh(tb, "ip", "-n", name, "link", "set", "lo", "up")
	sh(tb, "ip", "-n", name, "route", "add", "default", "via", "198.51.100.1")
	return "/run/netns/" + name, del
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

// BenchmarkBlueprintBoot compares create → first output of `echo hi` from
// the daemon-built default computer with the same from the busybox test
// image, alternating, on one gVisor daemon: a blueprint must boot as fast
// as any other snapshot. Reported: both medians and their ratio.
func BenchmarkBlueprintBoot(b *testing.B) {
	const rounds = 7
	d := startDaemonEnv(b, "gvisor", "", []string{"CUBICLE_DEFAULT_IMAGE=", "CUBICLE_BLUEPRINT_CACHE=" + blueprintCache()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	def, err := d.Client.WaitSnapshot(ctx, builtinDefault(b, d.Client).ID, nil)
	if err != nil || def.Status != protocol.SnapshotReady {
		b.Fatalf("default: %+v %v", def, err)
	}
	small := readySnapshot(b, d.Client, "busybox", testImage(b))
	var blueprint, busybox []time.Duration
	for b.Loop() {
		for range rounds {
			total, _ := createToFirstOutput(b, d.Client, def.ID)
			blueprint = append(blueprint, total)
			total, _ = createToFirstOutput(b, d.Client, small.ID)
			busybox = append(busybox, total)
		}
	}
	bp, bb := ms(median(blueprint)), ms(median(busybox))
	b.ReportMetric(bp, "default-ms")
	b.ReportMetric(bb, "busybox-ms")
	b.ReportMetric(bp/bb, "ratio")
	b.ReportMetric(0, "ns/op")
}
