package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// reportPercentiles adds p50 and p90 of ds to b's output.
func reportPercentiles(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds())/1000, "p90-ms")
}

// BenchmarkBareRunsc is the baseline the driver is compared against:
// `runsc --platform=systrap run` of the busybox rootfs running `echo hi`,
// no network, runsc's default flags otherwise.
func BenchmarkBareRunsc(b *testing.B) {
	e := requireEnv(b)
	merged, _ := rootFS(b)
	bundle := b.TempDir()
	spec := &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: merged},
		Process: &specs.Process{Args: []string{"/bin/echo", "hi"}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		}},
	}
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(b.TempDir(), "runsc")
	b.Cleanup(func() { unmountAll(filepath.Join(root, "null-netns")) })
	var ds []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		out, err := exec.Command(e.runsc, "--root", root, "--platform=systrap", "--network=none",
			"run", "--bundle", bundle, newID(b)).CombinedOutput()
		ds = append(ds, time.Since(t0))
		if err != nil || strings.TrimSpace(string(out)) != "hi" {
			b.Fatalf("runsc run: %v: %s", err, out)
		}
	}
	reportPercentiles(b, ds)
}

// BenchmarkStart measures Driver.Start until the stand-in agent answers on
// the sandbox's address, for the chosen flags and the alternatives.
func BenchmarkStart(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"overlay-root-self", []Option{WithOverlay("root:self")}},
		{"file-access-shared", []Option{WithFileAccess("shared")}},
		{"host-settings-ignore", []Option{WithRunscFlags("--host-settings=ignore")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			d := newDriver(b, c.opts...)
			var ds []time.Duration
			for b.Loop() {
				b.StopTimer()
				merged, _ := rootFS(b)
				ns, ip := netNS(b)
				s := &sandbox{id: newID(b), ip: ip}
				s.spec = runtime.Spec{ID: s.id, RootFS: merged, AgentBinary: testEnv.standin,
					Env: []string{"STANDIN_PORT=" + standinPort}, Hostname: "bench", NetNS: ns}
				b.StartTimer()
				t0 := time.Now()
				if err := d.Start(context.Background(), s.spec); err != nil {
					b.Fatal(err)
				}
				waitReady(b, s)
				ds = append(ds, time.Since(t0))
				b.StopTimer()
				if err := d.Stop(context.Background(), s.id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			reportPercentiles(b, ds)
		})
	}
}

// BenchmarkSmallFiles compares in-sandbox small-file I/O on the root
// filesystem with --overlay2=none (writes go to the host upper dir) and
// gVisor's default root:self (writes stay in the Sentry's file store).
func BenchmarkSmallFiles(b *testing.B) {
	const script = `mkdir -p /work && cd /work && i=0; while [ $i -lt 1000 ]; do echo data$i > f$i; i=$((i+1)); done; cat f* > /dev/null; rm -rf /work`
	for _, overlay := range []string{"none", "root:self"} {
		b.Run(strings.ReplaceAll(overlay, ":", "-"), func(b *testing.B) {
			d := newDriver(b, WithOverlay(overlay))
			s := startSandbox(b, d, runtime.Limits{})
			var ds []time.Duration
			for b.Loop() {
				t0 := time.Now()
				s.sh(b, script)
				ds = append(ds, time.Since(t0))
			}
			reportPercentiles(b, ds)
		})
	}
}

// BenchmarkDownload measures a 256 MiB TCP download into a sandbox from a
// server on the host end of its veth, under the driver's network flags and
// the alternatives, against the host kernel's own stack in the same
// network namespace (`ip netns exec`, the same busybox nc). Reported: MB/s
// and the ratio to the host's. (--tx-checksum-offload is not a candidate:
// with it the sandbox's packets never arrive over a veth.)
func BenchmarkDownload(b *testing.B) {
	const size = 256 << 20
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		buf := make([]byte, 1<<20)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for n := 0; n < size; n += len(buf) {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	gateway := func(ip string) string { // the /30's host end
		p := net.ParseIP(ip).To4()
		p[3]--
		return p.String()
	}
	mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	var host float64
	b.Run("host-kernel", func(b *testing.B) {
		ns, ip := netNS(b)
		var ds []float64
		for b.Loop() {
			t0 := time.Now()
			out, err := exec.Command("ip", "netns", "exec", filepath.Base(ns), "busybox", "nc", gateway(ip), strconv.Itoa(port)).Output()
			if err != nil || len(out) != size {
				b.Fatalf("host nc: %v, %d bytes", err, len(out))
			}
			ds = append(ds, mbps(time.Since(t0)))
		}
		host = medianOf(ds)
		b.ReportMetric(host, "MB/s")
	})
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"gvisor-gro", []Option{WithRunscFlags("--gvisor-gro")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := startSandbox(b, newDriver(b, c.opts...), runtime.Limits{})
			cmd := fmt.Sprintf("nc %s %d > /dev/null && echo ok", gateway(s.ip), port)
			var ds []float64
			for b.Loop() {
				t0 := time.Now()
				if out := strings.TrimSpace(s.sh(b, cmd)); out != "ok" {
					b.Fatalf("sandbox nc: %q", out)
				}
				ds = append(ds, mbps(time.Since(t0)))
			}
			v := medianOf(ds)
			b.ReportMetric(v, "MB/s")
			if host > 0 {
				b.ReportMetric(host/v, "x-slower-than-host")
			}
		})
	}
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkRootFSConfigs measures untarring 4,000 small files into the
// root filesystem (the I/O matrix's untar row, at driver level on the
// busybox image) under runsc root-filesystem configurations and in a host
// chroot of an overlay like the sandboxes', each round running it once in
// every one of them, so all see the same machine load. overlay-root-self
// is the reference: gVisor's own file store is faster, but its writes
// never reach the host upper dir, so capture, diff, fs_capacity_bytes and
// persistence could not work with it.
func BenchmarkRootFSConfigs(b *testing.B) {
	const setup = `mkdir -p /src && cd /src && i=0; while [ $i -lt 4000 ]; do d=d$((i%40)); mkdir -p $d; echo file$i > $d/f$i; i=$((i+1)); done; tar cf /src.tar -C /src . && rm -rf /src && echo ok`
	const job = `rm -rf /x && mkdir /x && tar xf /src.tar -C /x && echo ok`
	configs := []struct {
		name string
		opts []Option
	}{
		{"default", nil},
		{"dcache-10000", []Option{WithRunscFlags("--dcache=10000")}},
		{"file-access-shared", []Option{WithFileAccess("shared")}},
		{"overlay-root-self", []Option{WithOverlay("root:self")}},
	}
	hostRoot, _ := rootFS(b)
	if out, err := exec.Command("chroot", hostRoot, "/bin/sh", "-c", setup).CombinedOutput(); err != nil {
		b.Fatalf("host chroot setup: %v: %s", err, out)
	}
	boxes := make([]*sandbox, len(configs))
	for i, c := range configs {
		boxes[i] = startSandbox(b, newDriver(b, c.opts...), runtime.Limits{})
		if out := strings.TrimSpace(boxes[i].sh(b, setup)); out != "ok" {
			b.Fatalf("%s setup: %q", c.name, out)
		}
	}
	ms := func(t0 time.Time) float64 { return float64(time.Since(t0).Microseconds()) / 1000 }
	in := make([][]float64, len(configs))
	var on []float64
	for b.Loop() {
		for i, s := range boxes {
			t0 := time.Now()
			if out := strings.TrimSpace(s.sh(b, job)); out != "ok" {
				b.Fatalf("%s untar: %q", configs[i].name, out)
			}
			in[i] = append(in[i], ms(t0))
		}
		t0 := time.Now()
		if out, err := exec.Command("chroot", hostRoot, "/bin/sh", "-c", job).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
			b.Fatalf("host chroot: %v: %s", err, out)
		}
		on = append(on, ms(t0))
	}
	host := medianOf(on)
	b.ReportMetric(host, "host-ms")
	for i, c := range configs {
		v := medianOf(in[i])
		b.ReportMetric(v, c.name+"-ms")
		b.ReportMetric(v/host, c.name+"-ratio")
	}
	b.ReportMetric(0, "ns/op")
}
