package e2e

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// dnsAnswer is the A record every fake nameserver gives.
const dnsAnswer = "203.0.113.7"

// serveDNS runs a nameserver on addr:53 (UDP and TCP) inside the internet
// that answers every A question with dnsAnswer. It returns the number of
// queries and TCP connections it has received.
func (in *internet) serveDNS(t testing.TB, addr string) *atomic.Int64 {
	var seen atomic.Int64
	pc := in.listenPacket(t, addr+":53")
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			seen.Add(1)
			if resp := dnsReply(buf[:n]); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	ln := in.listen(t, addr+":53")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			seen.Add(1)
			go func() {
				defer c.Close()
				var size [2]byte
				if _, err := io.ReadFull(c, size[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(size[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				if resp := dnsReply(q); resp != nil {
					_, _ = c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(resp))), resp...))
				}
			}()
		}
	}()
	return &seen
}

// dnsReply answers query's A questions with dnsAnswer (nil: not a query).
func dnsReply(query []byte) []byte {
	var m dnsmessage.Message
	if err := m.Unpack(query); err != nil || m.Header.Response {
		return nil
	}
	m.Header.Response, m.Header.Authoritative = true, true
	a := [4]byte(netip.MustParseAddr(dnsAnswer).AsSlice())
	for _, q := range m.Questions {
		if q.Type == dnsmessage.TypeA {
			m.Answers = append(m.Answers, dnsmessage.Resource{
				Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
				Body:   &dnsmessage.AResource{A: a},
			})
		}
	}
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// TestEgressDNSOnlyToResolver: under an allow list, port 53 is open only
// toward the nameserver the sandbox's resolv.conf names (derived from the
// daemon's --host-resolv-conf). A sandbox cannot reach port 53 (UDP or TCP)
// of any other host — a channel around the list — while names still
// resolve through its resolver.
func TestEgressDNSOnlyToResolver(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testEgressDNS(t, rt) })
	}
}

func testEgressDNS(t *testing.T, rt string) {
	in := newInternet(t)
	resolver, other := in.addr(0), in.addr(1)
	toResolver, toOther := in.serveDNS(t, resolver), in.serveDNS(t, other)
	hostResolv := filepath.Join(t.TempDir(), "resolv.conf")
	// The loopback entry is dropped, as systemd-resolved's would be.
	if err := os.WriteFile(hostResolv, []byte("nameserver 127.0.0.53\nnameserver "+resolver+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonArgs(t, rt, "", "--host-resolv-conf", hostResolv)
	sn := readySnapshot(t, d.Client, "dns", testImage(t))
	c := d.Client
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.Name = "dns-" + rt
		r.ProxyConfig = json.RawMessage(`{"access_control":{"allow_list":["allowed.test"]}}`)
	})

	if got := mustRun(t, c, sb.Name, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver "+resolver) || strings.Contains(got, "127.0.0.53") {
		t.Fatalf("resolv.conf = %q, want nameserver %s only", got, resolver)
	}
	// Resolution through the configured resolver works (UDP), and TCP
	// to it connects.
	allowed(t, c, sb.Name, "nslookup allowed.test 2>&1", dnsAnswer)
	if toResolver.Load() == 0 {
		t.Fatal("the resolver saw no query")
	}
	allowed(t, c, sb.Name, "nc -w 3 "+resolver+" 53 </dev/null 2>&1; echo rc=$?", "rc=0")

	// Any other address's port 53: UDP gets no answer and never arrives;
	// TCP is refused at once.
	out, _, code := run(t, c, sb.Name, "nslookup allowed.test "+other+" 2>&1")
	if code == 0 || strings.Contains(out, dnsAnswer) {
		t.Fatalf("nslookup via %s (not the resolver): exit %d, %q; want failure", other, code, out)
	}
	deniedFast(t, c, sb.Name, "nc -w 3 "+other+" 53 </dev/null 2>&1; exit 1", "refused", "unreachable")
	if n := toOther.Load(); n != 0 {
		t.Fatalf("%d queries or connections reached port 53 of %s", n, other)
	}
}
