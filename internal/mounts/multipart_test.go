package mounts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

// TestS3MountMultipart: with 5 MiB parts a 20 MiB file is stored as a
// five-part multipart upload (its ETag says so) with the bytes written,
// and no upload is left open; a file of one part is a single PUT.
func TestS3MountMultipart(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), "sb1", "ws", s3Config(srv, "bkt", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Remove(context.Background(), "sb1") })
	for _, tc := range []struct {
		name  string
		size  int64
		parts string // the ETag's "-N" suffix
	}{{"big", 20<<20 + 123, "-5\""}, {"small", 5 << 20, ""}} {
		f, err := os.Create(filepath.Join(binds[0].Source, tc.name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(pattern{}, tc.size)); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got := sha256File(t, filepath.Join(srv.Root, "bkt", tc.name)); !bytes.Equal(got, h.Sum(nil)) {
			t.Fatalf("%s: the object differs from what was written", tc.name)
		}
		head, err := srv.Client.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String(tc.name)})
		if err != nil {
			t.Fatal(err)
		}
		if etag := aws.ToString(head.ETag); tc.parts != "" && !strings.HasSuffix(etag, tc.parts) || tc.parts == "" && strings.Contains(etag, "-") {
			t.Fatalf("%s: ETag %s, want a multipart one ending %q", tc.name, etag, tc.parts)
		}
	}
	ups, err := srv.Client.ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String("bkt")})
	if err != nil || len(ups.Uploads) != 0 {
		t.Fatalf("multipart uploads left open: %v %v", ups, err)
	}
}

// TestS3PutPartsAbort: a multipart upload the store refuses to complete
// (parts under its 5 MiB minimum) fails with the store's answer and is
// aborted, leaving no upload open.
func TestS3PutPartsAbort(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	be := newS3Backend(&S3{EndpointURL: srv.Endpoint, Region: "us-east-1", Bucket: "bkt", PathStyle: true},
		credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, ""), http.DefaultClient, 0)
	be.partSize = 1 << 20 // below what S3 takes
	data := bytes.Repeat([]byte("x"), 3<<20)
	err := be.Put(context.Background(), "small-parts", bytes.NewReader(data), int64(len(data)))
	if err == nil || !strings.Contains(err.Error(), "complete") {
		t.Fatalf("Put with 1 MiB parts: %v, want the store's refusal to complete", err)
	}
	ups, err := srv.Client.ListMultipartUploads(context.Background(), &s3.ListMultipartUploadsInput{Bucket: aws.String("bkt")})
	if err != nil || len(ups.Uploads) != 0 {
		t.Fatalf("multipart uploads left open: %v %v", ups.Uploads, err)
	}
	wantNoObject(t, srv, "small-parts")
}
