package mounts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/cubicle-dev/cubicle/internal/awssts"
	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

// roleConfig is a mount_config for the bucket at endpoint, mounted at
// /data through role_arn.
func roleConfig(endpoint string) []byte {
	return fmt.Appendf(nil, `{"auth":{"aws":{"role_arn":"arn:aws:iam::123456789012:role/data","session_tags":{"team":"blue"}}},
		"mounts":[{"id":"d","type":"s3","mount_path":"/data","s3":{"endpoint_url":%q,"bucket":"bkt","path_style":true}}]}`, endpoint)
}

// TestS3MountRole: with auth.aws.role_arn the mount's client uses the
// temporary credentials STS grants the workspace's base keys (the store
// takes no others), and assumes the role again before they expire.
func TestS3MountRole(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "a.txt", []byte("hello"))
	base := aws.Credentials{AccessKeyID: "BASEAK", SecretAccessKey: "base-secret"}
	// Renewed RenewBefore ahead of expiry: these are due for renewal 2 s
	// after they are granted.
	temp := aws.Credentials{AccessKeyID: "ASIATEMPORARY", SecretAccessKey: "temporary-secret", SessionToken: "session-token"}
	sts := ststest.Start(t, base, temp, awssts.RenewBefore+2*time.Second)
	endpoint := srv.SessionFront(t, temp)
	// The store takes nothing but the session: not the temporary key
	// without its token, nor the base keys.
	for _, c := range []aws.Credentials{{AccessKeyID: temp.AccessKeyID, SecretAccessKey: temp.SecretAccessKey}, base} {
		cl := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(endpoint), UsePathStyle: true,
			Credentials: credentials.StaticCredentialsProvider{Value: c}})
		if _, err := cl.HeadObject(context.Background(), &s3.HeadObjectInput{Bucket: aws.String("bkt"), Key: aws.String("a.txt")}); err == nil {
			t.Fatalf("the store took %s's keys", c.AccessKeyID)
		}
	}
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), STSEndpoint: sts.URL,
		Secrets: fakeSecrets{values: map[string]string{"AWS_ACCESS_KEY_ID": base.AccessKeyID, "AWS_SECRET_ACCESS_KEY": base.SecretAccessKey + "\n"}}})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), "sb1", "ws-1", roleConfig(endpoint), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Remove(context.Background(), "sb1") })
	mnt := binds[0].Source
	if b, err := os.ReadFile(filepath.Join(mnt, "a.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("read a.txt = %q, %v", b, err)
	}
	calls := sts.Calls()
	if len(calls) != 1 {
		t.Fatalf("STS granted %d calls before the first renewal, want 1", len(calls))
	}
	if c := calls[0]; c.Get("RoleArn") != "arn:aws:iam::123456789012:role/data" || c.Get("RoleSessionName") != "cubicle-sb1" ||
		c.Get("ExternalId") != "ws-1" || c.Get("Tags.member.1.Key") != "team" || c.Get("Tags.member.1.Value") != "blue" {
		t.Fatalf("AssumeRole call = %v", c)
	}
	time.Sleep(2500 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(mnt, "b.txt"), []byte("written"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "b.txt", "written")
	if n := len(sts.Calls()); n < 2 {
		t.Fatalf("STS granted %d calls, want a renewal before expiry", n)
	}
}

// TestS3MountRoleRefused: base keys STS refuses, or none, fail Up with
// the cause and leave nothing behind.
func TestS3MountRoleRefused(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	temp := aws.Credentials{AccessKeyID: "ASIATEMPORARY", SecretAccessKey: "temporary-secret", SessionToken: "t"}
	sts := ststest.Start(t, aws.Credentials{AccessKeyID: "BASEAK", SecretAccessKey: "base-secret"}, temp, time.Hour)
	endpoint := srv.SessionFront(t, temp)
	for _, tc := range []struct {
		values map[string]string
		want   string
	}{
		{map[string]string{"AWS_ACCESS_KEY_ID": "BASEAK", "AWS_SECRET_ACCESS_KEY": "wrong"}, "SignatureDoesNotMatch"},
		{map[string]string{"AWS_ACCESS_KEY_ID": "BASEAK"}, "workspace secret AWS_SECRET_ACCESS_KEY"},
	} {
		svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), STSEndpoint: sts.URL, Secrets: fakeSecrets{values: tc.values}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.Up(context.Background(), "sb1", "ws-1", roleConfig(endpoint), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "mount_config.auth.aws.role_arn") {
			t.Fatalf("Up = %v, want an error naming role_arn and %q (%d calls)", err, tc.want, len(sts.Calls()))
		}
		if _, err := os.Stat(filepath.Join(svc.opt.Dir, "sb1")); !os.IsNotExist(err) {
			t.Fatalf("a failed Up left its directory: %v", err)
		}
	}
}
