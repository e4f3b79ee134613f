package mountstest

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
)

// GCS is a running fake-gcs-server (the standard GCS emulator) on
// loopback over plain HTTP. KeyJSON is a service-account key file whose
// token_uri is a local OAuth token endpoint, so a client mints tokens the
// way it would from Google's.
type GCS struct {
	Endpoint string
	KeyJSON  []byte
}

// StartGCS runs fake-gcs-server with bucket until the test ends.
func StartGCS(t testing.TB, bucket string) *GCS {
	t.Helper()
	bin := tool(t, "fake-gcs-server", "fakegcs", "github.com/fsouza/fake-gcs-server")
	data := t.TempDir()
	if err := os.Mkdir(filepath.Join(data, bucket), 0o755); err != nil {
		t.Fatal(err)
	}
	addr := listen(t)
	host, port, _ := splitHostPort(addr)
	g := &GCS{Endpoint: "http://" + addr}
	serve(t, addr, bin, "-scheme", "http", "-host", host, "-port", port, "-backend", "memory", "-data", data,
		"-public-host", addr, "-external-url", g.Endpoint, "-log-level", "warn")
	g.KeyJSON = serviceAccountKey(t)
	return g
}

func splitHostPort(addr string) (string, string, error) {
	u, err := url.Parse("//" + addr)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// serviceAccountKey is a fresh key file whose token endpoint grants any
// signed assertion a bearer token.
func serviceAccountKey(t testing.TB) []byte {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	tokens := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("assertion") == "" {
			http.Error(w, "no assertion", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"access_token":"test-token","token_type":"Bearer","expires_in":3600}`)
	}))
	t.Cleanup(tokens.Close)
	b, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "test", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "mounts@test.iam.gserviceaccount.com", "client_id": "1", "token_uri": tokens.URL,
	})
	return b
}

// Put stores data as bucket/name.
func (g *GCS) Put(t testing.TB, bucket, name string, data []byte) {
	t.Helper()
	u := g.Endpoint + "/upload/storage/v1/b/" + bucket + "/o?" + url.Values{"uploadType": {"media"}, "name": {name}}.Encode()
	resp, err := http.Post(u, "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("put %s/%s: %s", bucket, name, resp.Status)
	}
}

// Get returns bucket/name's bytes, or ok false if there is none.
func (g *GCS) Get(t testing.TB, bucket, name string) ([]byte, bool) {
	t.Helper()
	resp, err := http.Get(g.Endpoint + "/storage/v1/b/" + bucket + "/o/" + url.PathEscape(name) + "?alt=media")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}
