package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// networkData is the part of network events' data the timeline shows.
type networkData struct {
	Method     string   `json:"method"`
	Scheme     string   `json:"scheme"`
	Host       string   `json:"host"`
	Path       string   `json:"path"`
	Status     int      `json:"status"`
	Dest       string   `json:"dest"`
	Port       int      `json:"port"`
	Protocol   string   `json:"protocol"`
	Name       string   `json:"name"`
	Type       string   `json:"type"`
	Answers    []string `json:"answers"`
	BytesUp    int64    `json:"bytes_up"`
	BytesDown  int64    `json:"bytes_down"`
	DurationMS int64    `json:"duration_ms"`
	Allowed    *bool    `json:"allowed"` // absent for flows (conntrack sees only those let through)
	Reason     string   `json:"reason"`
	Rules      []string `json:"rules"`
}

// networkLine renders a network event after the timeline's head: what
// was reached, its outcome, bytes up/down and duration.
func networkLine(e protocol.AuditEvent) string {
	var d networkData
	_ = json.Unmarshal(e.Data, &d)
	var what string
	switch e.Type {
	case protocol.EventNetworkHTTP:
		what = fmt.Sprintf("%s %s://%s%s → %d", d.Method, d.Scheme, d.Host, d.Path, d.Status)
	case protocol.EventNetworkTLS:
		what = "tls " + d.Host + " (" + d.Dest + ")"
	case protocol.EventNetworkFlow:
		what = fmt.Sprintf("%s %s:%d", d.Protocol, d.Dest, d.Port)
	case protocol.EventNetworkDNS:
		what = fmt.Sprintf("dns %s %s → %s", d.Type, d.Name, strings.Join(d.Answers, ","))
		if len(d.Answers) == 0 {
			what += "no answer"
		}
		return fmt.Sprintf("#%-4d %s", e.Step, what) + verdictSuffix(d)
	default:
		return e.Type + dataSummary(e.Data)
	}
	return fmt.Sprintf("#%-4d %s  ↑%d B ↓%d B %dms", e.Step, what, d.BytesUp, d.BytesDown, d.DurationMS) + verdictSuffix(d)
}

func verdictSuffix(d networkData) string {
	s := ""
	if len(d.Rules) > 0 {
		s += "  rules " + strings.Join(d.Rules, ",")
	}
	if d.Allowed != nil && !*d.Allowed {
		s += "  DENIED: " + d.Reason
	}
	return s
}
