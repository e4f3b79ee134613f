package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkEgress measures a small GET from inside a sandbox to the test
// internet, direct (a sandbox without proxy_config, whose traffic is only
// routed and NAT'd) and through the egress proxy: plain HTTP, TLS spliced
// by SNI, and TLS intercepted for header injection. The client keeps its
// connection alive, so this is per-request latency, not connection setup.
// Reported: p50 latency (µs) and requests per second.
func BenchmarkEgress(b *testing.B) {
	e := newEgressEnv(b, "gvisor")
	if code, body := e.api(b, "PUT", "/secrets/BENCH_TOKEN", map[string]string{"value": "Bearer bench"}); code != 200 {
		b.Fatalf("put secret: %d %s", code, body)
	}
	proxied := e.sandbox(b, "bench-proxied", `{"access_control":{"allow_list":["allowed.test","secure.test"]},
		"rules":[{"name":"inject","match_hosts":["secure.test"],"headers":[{"name":"Authorization","type":"workspace_secret","value":"{BENCH_TOKEN}"}]}]}`)
	direct := e.sandbox(b, "bench-direct", "")
	ip := e.in.addr(0)
	cases := []struct{ name, box, args string }{
		{"http/direct", direct.Name, "http://" + ip + "/"},
		{"http/proxied", proxied.Name, "-host allowed.test http://" + ip + "/"},
		{"https/direct", direct.Name, "-to " + ip + " -ca /tmp/inet-ca.pem https://allowed.test/"},
		{"https/proxied-splice", proxied.Name, "-to " + ip + " -ca /tmp/inet-ca.pem https://allowed.test/"},
		{"https/proxied-intercept", proxied.Name, "-to " + ip + " https://secure.test/"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			mustRun(b, e.d.Client, c.box, "egclient -n 20 "+c.args) // warm up: connections, leaf cert
			// At least 1000 requests per run: the ramp-up's small runs are
			// otherwise dominated by noise on a shared 2-core host.
			n := max(b.N, 1000)
			b.ResetTimer()
			out := mustRun(b, e.d.Client, c.box, fmt.Sprintf("egclient -n %d %s", n, c.args))
			b.StopTimer()
			var p50, rps float64
			for _, f := range strings.Fields(out) {
				if v, ok := strings.CutPrefix(f, "p50_us="); ok {
					p50, _ = strconv.ParseFloat(v, 64)
				}
				if v, ok := strings.CutPrefix(f, "rps="); ok {
					rps, _ = strconv.ParseFloat(v, 64)
				}
			}
			b.ReportMetric(p50, "p50_µs")
			b.ReportMetric(rps, "req/s")
		})
	}
}
