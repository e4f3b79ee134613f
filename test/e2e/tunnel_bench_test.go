package e2e

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// BenchmarkTunnelVsDirect compares, per runtime and in one run, a TCP
// connection through the daemon's tunnel with a direct one from the host
// to the sandbox's address, both to `nc -ll -e cat` inside: throughput of
// a 32 MiB echo and the median 1-byte round trip, with the tunnel's
// throughput ratio and added latency.
func BenchmarkTunnelVsDirect(b *testing.B) {
	ref := testImage(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d, sb := benchSandbox(b, rt, ref)
			mustRun(b, d.Client, sb.Name, "for p in 9000 9001; do setsid busybox nc -ll -p $p -e cat </dev/null >/dev/null 2>&1 & done")
			ip := strings.TrimSpace(mustRun(b, d.Client, sb.Name, "ip -o -4 addr show eth0 | awk '{print $4}' | cut -d/ -f1"))
			ctx := context.Background()
			tn, err := d.Client.OpenTunnel(ctx, sb.Name)
			if err != nil {
				b.Fatal(err)
			}
			defer tn.Close()
			dial := map[string]func() (net.Conn, error){
				"direct": func() (net.Conn, error) { return net.Dial("tcp", net.JoinHostPort(ip, "9000")) },
				"tunnel": func() (net.Conn, error) { return tn.Dial(ctx, 9001) },
			}
			const size = 32 << 20
			mbps := map[string][]float64{}
			rtt := map[string][]time.Duration{}
			for b.Loop() {
				for _, name := range []string{"direct", "tunnel"} {
					var c net.Conn
					for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
						if c, err = dial[name](); err == nil || time.Now().After(deadline) {
							break
						}
					}
					if err != nil {
						b.Fatalf("%s: %v", name, err)
					}
					t0 := time.Now()
					go func() {
						buf := make([]byte, 256<<10)
						for range size / len(buf) {
							c.Write(buf)
						}
					}()
					if _, err := io.CopyN(io.Discard, c, size); err != nil {
						b.Fatalf("%s: %v", name, err)
					}
					mbps[name] = append(mbps[name], size/time.Since(t0).Seconds()/1e6)
					one := []byte{1}
					for range 100 {
						t1 := time.Now()
						c.Write(one)
						if _, err := io.ReadFull(c, one); err != nil {
							b.Fatal(err)
						}
						rtt[name] = append(rtt[name], time.Since(t1))
					}
					c.Close()
				}
			}
			dm, tm := median(mbps["direct"]), median(mbps["tunnel"])
			dr, tr := median(rtt["direct"]), median(rtt["tunnel"])
			b.ReportMetric(dm, "direct-MB/s")
			b.ReportMetric(tm, "tunnel-MB/s")
			b.ReportMetric(tm/dm, "throughput-ratio")
			b.ReportMetric(float64(dr.Microseconds()), "direct-rtt-µs")
			b.ReportMetric(float64(tr.Microseconds()), "tunnel-rtt-µs")
			b.ReportMetric(float64((tr - dr).Microseconds()), "added-rtt-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
}
