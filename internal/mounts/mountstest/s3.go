// Package mountstest starts real servers on loopback for the data-mount
// tests: versitygw (an S3 gateway with its posix backend, built from
// tools/versitygw), fake-gcs-server (the GCS emulator, tools/fakegcs) and
// git http-backend behind a TLS test server.
package mountstest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// S3 is a running versitygw: Endpoint takes AccessKey/SecretKey, and
// buckets are directories under Root.
type S3 struct {
	Endpoint             string
	AccessKey, SecretKey string
	Root                 string
	Client               *s3.Client
	// Stop kills the server (an outage); the test's end does too.
	Stop func()
}

// repoRoot is the module root (this file is internal/mounts/mountstest).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

var (
	buildMu sync.Mutex
	built   = map[string]error{}
)

// tool returns bin/<name>, building pkg in the module tools/<module> if
// make has not: the test servers are pinned there, apart from ours.
func tool(t testing.TB, name, module, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	p := filepath.Join(repoRoot(), "bin", name)
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if err, done := built[name]; done && err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", p, pkg)
	cmd.Dir = filepath.Join(repoRoot(), "tools", module)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		built[name] = fmt.Errorf("build %s: %v: %s", name, err, out)
		t.Fatal(built[name])
	}
	return p
}

// listen picks a free loopback address for a server to bind.
func listen(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// serve runs a server process until the test ends (or the returned stop)
// and waits for it to listen on addr; its output is logged if the test
// fails.
func serve(t testing.TB, addr, bin string, args ...string) (stop func()) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("%s:\n%s", filepath.Base(bin), logs.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s: %s", bin, addr, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StartS3 runs versitygw on a loopback port until the test ends and
// creates bucket.
func StartS3(t testing.TB, bucket string) *S3 {
	t.Helper()
	bin := tool(t, "versitygw", "versitygw", "github.com/versity/versitygw/cmd/versitygw")
	root := t.TempDir()
	addr := listen(t)
	s := &S3{Endpoint: "http://" + addr, AccessKey: "cubicletestkey", SecretKey: "cubicle-test-secret-0123456789", Root: root}
	s.Stop = serve(t, addr, bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", addr, "--quiet", "posix", root)
	s.Client = s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(s.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""), HTTPClient: http.DefaultClient,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired})
	if _, err := s.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		t.Fatalf("create bucket %s: %v", bucket, err)
	}
	return s
}

// Put stores data as bucket/key.
func (s *S3) Put(t testing.TB, bucket, key string, data []byte) {
	t.Helper()
	if _, err := s.Client.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)}); err != nil {
		t.Fatalf("put %s/%s: %v", bucket, key, err)
	}
}

// Get returns bucket/key's bytes, or ok false if there is no such object.
func (s *S3) Get(t testing.TB, bucket, key string) (data []byte, ok bool) {
	t.Helper()
	out, err := s.Client.GetObject(context.Background(), &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return nil, false
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("get %s/%s: %v", bucket, key, err)
	}
	return b, true
}
