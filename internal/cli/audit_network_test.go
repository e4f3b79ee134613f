package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestNetworkLine(t *testing.T) {
	ev := func(typ string, step int64, data map[string]any) protocol.AuditEvent {
		b, _ := json.Marshal(data)
		return protocol.AuditEvent{Kind: protocol.KindNetwork, Type: typ, Step: step, Data: b}
	}
	for _, c := range []struct {
		ev   protocol.AuditEvent
		want string
	}{
		{ev(protocol.EventNetworkHTTP, 4, map[string]any{"method": "GET", "scheme": "https", "host": "api.test", "path": "/v1",
			"status": 200, "bytes_up": 90, "bytes_down": 1200, "duration_ms": 12, "allowed": true, "rules": []string{"inject"}}),
			"#4    GET https://api.test/v1 → 200  ↑90 B ↓1200 B 12ms  rules inject"},
		{ev(protocol.EventNetworkTLS, 0, map[string]any{"host": "bad.test", "dest": "1.2.3.4:443", "allowed": false, "reason": "host bad.test is not in allow_list"}),
			"#0    tls bad.test (1.2.3.4:443)  ↑0 B ↓0 B 0ms  DENIED: host bad.test is not in allow_list"},
		{ev(protocol.EventNetworkFlow, 7, map[string]any{"protocol": "tcp", "dest": "1.2.3.4", "port": 7000, "bytes_up": 60, "bytes_down": 67, "duration_ms": 3}),
			"#7    tcp 1.2.3.4:7000  ↑60 B ↓67 B 3ms"},
		{ev(protocol.EventNetworkDNS, 9, map[string]any{"name": "a.test", "type": "A", "answers": []string{"1.2.3.4"}, "allowed": true}),
			"#9    dns A a.test → 1.2.3.4"},
	} {
		if got := networkLine(c.ev); got != c.want {
			t.Fatalf("networkLine = %q\nwant          %q", got, c.want)
		}
	}
	if line := timelineLine(ev(protocol.EventNetworkFlow, 1, map[string]any{"protocol": "udp", "dest": "8.8.8.8", "port": 53})); !strings.Contains(line, "network   #1    udp 8.8.8.8:53") {
		t.Fatalf("timeline line %q", line)
	}
}
