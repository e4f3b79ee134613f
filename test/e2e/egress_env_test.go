package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// internet is a network namespace the test owns that plays "the internet"
// for sandboxes: reached from the host through a veth (so sandbox egress is
// routed and NAT'd to it like to any outside address), with HTTP on :80 and
// :8080, HTTPS on :443 (a test CA's certificate) and a raw TCP echo on :7000
// on every address. Nothing leaves the machine.
type internet struct {
	ns    string // netns name (ip netns)
	addrs []string
	caPEM []byte // the test CA that signed the HTTPS certificate

	mu     sync.Mutex
	auths  []string                // Authorization headers the HTTPS server received
	routes map[string]http.Handler // HTTPS handlers by Host (see route)
}

// newInternet creates the namespace with addresses 198.18.<n>.2..5 (n is
// random per test), serving names for the daemon's --egress-resolve.
func newInternet(t testing.TB) *internet {
	n := 100 + time.Now().UnixNano()%150
	in := &internet{ns: fmt.Sprintf("cbtest-inet-%d", n)}
	hostIf := fmt.Sprintf("xin%d", n)
	base := fmt.Sprintf("198.18.%d.", n)
	sh(t, "ip", "netns", "add", in.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", in.ns).Run() })
	sh(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", in.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	sh(t, "ip", "addr", "add", base+"1/24", "dev", hostIf)
	sh(t, "ip", "link", "set", hostIf, "up")
	for i := 2; i <= 5; i++ {
		a := fmt.Sprintf("%s%d", base, i)
		in.addrs = append(in.addrs, a)
		sh(t, "ip", "-n", in.ns, "addr", "add", a+"/24", "dev", "eth0")
	}
	sh(t, "ip", "-n", in.ns, "link", "set", "eth0", "up")
	sh(t, "ip", "-n", in.ns, "link", "set", "lo", "up")
	sh(t, "ip", "-n", in.ns, "route", "add", "default", "via", base+"1")
	in.serve(t)
	return in
}

// addr returns the i-th address (0-based) of the namespace.
func (in *internet) addr(i int) string { return in.addrs[i] }

// inNS runs open on a thread inside the namespace (sockets keep the
// namespace they were created in).
func (in *internet) inNS(t testing.TB, what string, open func() error) {
	t.Helper()
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread dies with us
		h, herr := netns.GetFromName(in.ns)
		if herr != nil {
			err = herr
			return
		}
		defer h.Close()
		if err = netns.Set(h); err != nil {
			return
		}
		err = open()
	}()
	<-done
	if err != nil {
		t.Fatalf("%s in %s: %v", what, in.ns, err)
	}
}

// listen opens a TCP listener inside the namespace.
func (in *internet) listen(t testing.TB, addr string) net.Listener {
	var ln net.Listener
	in.inNS(t, "listen on "+addr, func() (err error) { ln, err = net.Listen("tcp4", addr); return err })
	t.Cleanup(func() { ln.Close() })
	return ln
}

// listenPacket opens a UDP socket inside the namespace.
func (in *internet) listenPacket(t testing.TB, addr string) net.PacketConn {
	var pc net.PacketConn
	in.inNS(t, "listen on udp "+addr, func() (err error) { pc, err = net.ListenPacket("udp4", addr); return err })
	t.Cleanup(func() { pc.Close() })
	return pc
}

func (in *internet) serve(t testing.TB) {
	caCert, caKey, caPEM := newTestCA(t)
	in.caPEM = caPEM
	leaf := leafCert(t, caCert, caKey, "secure.test", "allowed.test", "other.test", "denied.test",
		// AWS-like endpoints for AWS signing tests (see route).
		"*.amazonaws.com", "*.us-west-2.amazonaws.com", "*.us-east-2.amazonaws.com", "*.s3.us-west-2.amazonaws.com",
		// Google APIs, and the token, STS and callback endpoints of the
		// credential tests.
		"*.googleapis.com", "*.e2e.test")
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, err := strconv.ParseInt(strings.TrimPrefix(r.URL.Path, "/bytes/"), 10, 64); err == nil {
			// /bytes/N: N zero bytes, for throughput benchmarks.
			w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
			_, _ = io.CopyN(w, zeros{}, n)
			return
		}
		fmt.Fprintf(w, "hello from the internet: host=%s\n", r.Host)
	})
	secure := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.mu.Lock()
		if h := in.routes[r.Host]; h != nil {
			in.mu.Unlock()
			h.ServeHTTP(w, r)
			return
		}
		in.auths = append(in.auths, r.Header.Get("Authorization")+"|"+r.Header.Get("X-Opaque"))
		in.mu.Unlock()
		// The secret is never echoed: the sandbox must not see it.
		fmt.Fprintf(w, "tls hello: host=%s auth-present=%v\n", r.Host, r.Header.Get("Authorization") != "")
	})
	for _, port := range []string{":80", ":8080"} {
		ln := in.listen(t, "0.0.0.0"+port)
		srv := &http.Server{Handler: plain}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
	}
	tln := tls.NewListener(in.listen(t, "0.0.0.0:443"), &tls.Config{Certificates: []tls.Certificate{leaf}})
	tsrv := &http.Server{Handler: secure}
	go tsrv.Serve(tln)
	t.Cleanup(func() { tsrv.Close() })
	echo := in.listen(t, "0.0.0.0:7000")
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "raw ok\n")
			c.Close()
		}
	}()
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// route makes the HTTPS server hand requests for host to h.
func (in *internet) route(host string, h http.Handler) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.routes == nil {
		in.routes = map[string]http.Handler{}
	}
	in.routes[host] = h
}

// receivedAuth returns the Authorization|X-Opaque pairs the HTTPS server saw.
func (in *internet) receivedAuth() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.auths...)
}

func newTestCA(t testing.TB) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "e2e test internet CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func leafCert(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, names ...string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// egClientSource is a small static HTTP(S) client uploaded into sandboxes:
// busybox has no TLS client that verifies certificates or sets SNI. It
// trusts SSL_CERT_FILE (how sandboxes trust the egress CA) plus -ca files,
// and with -n runs a latency benchmark over one keep-alive connection.
const egClientSource = `package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	ca := flag.String("ca", "", "extra CA file")
	to := flag.String("to", "", "connect to this IP instead of resolving the URL's host (SNI and Host stay the URL's)")
	n := flag.Int("n", 0, "benchmark: requests to send")
	host := flag.String("host", "", "Host header to send")
	method := flag.String("X", "GET", "request method")
	data := flag.String("d", "", "request body")
	var hdrs []string
	flag.Func("H", "header \"Name: value\" (repeatable)", func(s string) error { hdrs = append(hdrs, s); return nil })
	flag.Parse()
	pool, _ := x509.SystemCertPool()
	if pool == nil {
		pool = x509.NewCertPool()
	}
	if *ca != "" {
		b, err := os.ReadFile(*ca)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(2)
		}
		pool.AppendCertsFromPEM(b)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	if *to != "" {
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort(*to, port))
		}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	url := flag.Arg(0)
	if *n > 0 {
		var lat []time.Duration
		reused := 0
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			if i.Reused {
				reused++
			}
		}}
		start := time.Now()
		for i := 0; i < *n; i++ {
			t0 := time.Now()
			req, _ := http.NewRequest("GET", url, nil)
			req.Host = *host
			resp, err := c.Do(req.WithContext(httptrace.WithClientTrace(context.Background(), trace)))
			if err != nil {
				fmt.Println("ERR", err)
				os.Exit(1)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat = append(lat, time.Since(t0))
		}
		total := time.Since(start)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		fmt.Printf("p50_us=%d rps=%.0f reused=%d\n", lat[len(lat)/2].Microseconds(), float64(*n)/total.Seconds(), reused)
		return
	}
	t0 := time.Now()
	var body io.Reader
	if *data != "" {
		body = strings.NewReader(*data)
	}
	req, err := http.NewRequest(*method, url, body)
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(2)
	}
	req.Host = *host
	for _, h := range hdrs {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := c.Do(req)
	if err != nil {
		fmt.Printf("ERR %v (after %v)\n", err, time.Since(t0).Round(time.Millisecond))
		os.Exit(1)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("STATUS %d\n%s", resp.StatusCode, b)
	if resp.StatusCode >= 400 {
		os.Exit(3)
	}
}
`

var (
	egClientOnce sync.Once
	egClientPath string
	egClientErr  error
)

// egClient builds the client once per test binary (static, stdlib only).
func egClient(t testing.TB) string {
	egClientOnce.Do(func() {
		dir, err := os.MkdirTemp("", "egclient")
		if err != nil {
			egClientErr = err
			return
		}
		src := filepath.Join(dir, "main.go")
		if err := os.WriteFile(src, []byte(egClientSource), 0o644); err != nil {
			egClientErr = err
			return
		}
		egClientPath = filepath.Join(dir, "egclient")
		cmd := exec.Command("go", "build", "-o", egClientPath, src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GO111MODULE=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			egClientErr = fmt.Errorf("build egclient: %v\n%s", err, out)
		}
	})
	if egClientErr != nil {
		t.Fatal(egClientErr)
	}
	return egClientPath
}
