package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

func TestAWSEndpoint(t *testing.T) {
	cases := []struct{ host, service, region string }{
		{"s3.us-west-2.amazonaws.com", "s3", "us-west-2"},
		{"my-bucket.s3.us-west-2.amazonaws.com", "s3", "us-west-2"},
		{"my.dotted.bucket.s3.eu-central-1.amazonaws.com", "s3", "eu-central-1"},
		{"us-west-1-bucket.s3.ap-southeast-2.amazonaws.com:443", "s3", "ap-southeast-2"},
		{"bucket.s3.dualstack.us-east-2.amazonaws.com", "s3", "us-east-2"},
		{"s3.amazonaws.com", "s3", "us-east-1"},
		{"bucket.s3.amazonaws.com", "s3", "us-east-1"},
		{"s3-us-west-2.amazonaws.com", "s3", "us-west-2"},
		{"bucket.s3-external-1.amazonaws.com", "s3", "us-east-1"},
		{"bucket.s3-accelerate.dualstack.amazonaws.com", "s3", "us-east-1"},
		{"123456789012.s3-control.us-west-2.amazonaws.com", "s3", "us-west-2"},
		{"bucket.vpce-0a1b2c3d-4e5f.s3.us-east-1.vpce.amazonaws.com", "s3", "us-east-1"},
		{"sts.amazonaws.com", "sts", "us-east-1"},
		{"sts.us-east-2.amazonaws.com", "sts", "us-east-2"},
		{"sts-fips.us-east-1.amazonaws.com", "sts", "us-east-1"},
		{"iam.amazonaws.com", "iam", "us-east-1"},
		{"dynamodb.us-gov-west-1.amazonaws.com", "dynamodb", "us-gov-west-1"},
		{"ec2.fips.us-west-2.amazonaws.com", "ec2", "us-west-2"},
		{"lambda.eu-west-3.amazonaws.com.", "lambda", "eu-west-3"},
		{"abc123.execute-api.eu-west-1.amazonaws.com", "execute-api", "eu-west-1"},
		{"runtime.sagemaker.us-west-2.amazonaws.com", "sagemaker", "us-west-2"},
		{"bedrock-runtime.us-east-1.amazonaws.com", "bedrock", "us-east-1"},
		{"email.eu-west-1.amazonaws.com", "ses", "eu-west-1"},
		{"abcdef-ats.iot.us-east-1.amazonaws.com", "iot", "us-east-1"},
		{"data-ats.iot.us-east-1.amazonaws.com", "iotdata", "us-east-1"},
		{"S3.US-WEST-2.AMAZONAWS.COM", "s3", "us-west-2"},
		{"s3.cn-north-1.amazonaws.com.cn", "s3", "cn-north-1"},
		{"iam.amazonaws.com.cn", "iam", "cn-north-1"},
	}
	for _, c := range cases {
		svc, reg, ok := AWSEndpoint(c.host)
		if !ok || svc != c.service || reg != c.region {
			t.Errorf("AWSEndpoint(%q) = %q %q %v, want %q %q", c.host, svc, reg, ok, c.service, c.region)
		}
	}
	for _, h := range []string{"amazonaws.com", "example.com", "s3.us-west-2.amazonaws.com.evil.com", "notamazonaws.com"} {
		if svc, reg, ok := AWSEndpoint(h); ok {
			t.Errorf("AWSEndpoint(%q) = %q %q, want not ok", h, svc, reg)
		}
	}
}

func TestParseAWSRule(t *testing.T) {
	p, err := Parse([]byte(`{"rules":[{"name":"aws","type":"aws","enabled":true,"aws":{
		"access_key_id":{"type":"plaintext","value":"AKIDEXAMPLE"},
		"secret_access_key":{"type":"workspace_secret","value":"{AWS_SECRET}"}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Intercepts("bucket.s3.us-west-2.amazonaws.com") || !p.Intercepts("s3.cn-north-1.amazonaws.com.cn") || p.Intercepts("example.com") {
		t.Fatal("default hosts: wrong interception")
	}
	r := p.RulesFor("sts.amazonaws.com", "/")
	if len(r) != 1 || r[0].AWS == nil || r[0].AWS.AccessKeyID.Value != "AKIDEXAMPLE" ||
		r[0].AWS.SecretAccessKey.Type != "workspace_secret" || r[0].AWS.SecretAccessKey.Value != "AWS_SECRET" {
		t.Fatalf("rule = %+v", r)
	}
	p, err = Parse([]byte(`{"rules":[{"name":"aws","type":"aws","match_hosts":["minio.example.com"],"aws":{
		"access_key_id":"AK","secret_access_key":{"type":"opaque","value":"SK"},"region":"eu-west-1","service":"s3"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Intercepts("s3.us-west-2.amazonaws.com") || !p.Intercepts("minio.example.com") {
		t.Fatal("match_hosts not honoured")
	}
	for _, cfg := range []string{
		`{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::1:role/x"}}]}`,
		`{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/x","access_key_id":"AK"}}]}`,
		`{"rules":[{"name":"r","type":"aws","aws":{"access_key_id":"AK","secret_access_key":"SK","session_tags":{"a":"b"}}}]}`,
		`{"rules":[{"name":"r","type":"aws"}]}`,
		`{"rules":[{"name":"r","type":"aws","aws":{"access_key_id":"AK"}}]}`,
		`{"rules":[{"name":"r","type":"aws","aws":{"access_key_id":"AK","secret_access_key":{"type":"workspace_secret","value":"NAME"}}}]}`,
		`{"rules":[{"name":"r","type":"gcp","gcp":{"service_account_json":{"type":"plaintext","value":"{}"},"scopes":["x"]}}]}`,
	} {
		_, err := Parse([]byte(cfg))
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%s: err = %v, want a FieldError", cfg, err)
		}
	}
	p, err = Parse([]byte(`{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/x","session_tags":{"team":"a"}}}]}`))
	if err != nil || p.Rules[0].AWS.RoleARN == "" || p.Rules[0].AWS.SessionTags["team"] != "a" {
		t.Fatalf("role_arn rule: %+v %v", p, err)
	}
	if got := p.SecretNames(); fmt.Sprint(got) != "[AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY]" {
		t.Fatalf("a role rule uses the base credentials: %v", got)
	}
}

// TestSignAWS signs requests the way the proxy does and checks them against
// an independent signing of the request as received.
func TestSignAWS(t *testing.T) {
	creds := aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		method, url, body, service, region, wantHash string
	}{
		{"GET", "https://s3.us-west-2.amazonaws.com/bucket/a%20key?list-type=2&prefix=x", "", "s3", "us-west-2", "UNSIGNED-PAYLOAD"},
		{"PUT", "https://bucket.s3.us-west-2.amazonaws.com/k", "data", "s3", "us-west-2", "UNSIGNED-PAYLOAD"},
		{"POST", "https://sts.amazonaws.com/", "Action=GetCallerIdentity&Version=2011-06-15", "sts", "us-east-1", ""},
		{"GET", "https://iam.amazonaws.com/?Action=ListUsers&Version=2010-05-08", "", "iam", "us-east-1", ""},
	} {
		var body io.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		r, _ := http.NewRequest(c.method, c.url, body)
		r.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=DUMMY/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
		r.Header.Set("X-Amz-Date", "20200101T000000Z")
		r.Header.Set("X-Amz-Security-Token", "dummy")
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Te", "trailers")
		if err := signAWS(context.Background(), r, creds, c.service, c.region, at); err != nil {
			t.Fatal(err)
		}
		auth := r.Header.Get("Authorization")
		if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260102/"+c.region+"/"+c.service+"/aws4_request") ||
			r.Header.Get("X-Amz-Security-Token") != "" || strings.Contains(auth, "te;") || r.Header.Get("Te") != "trailers" {
			t.Fatalf("%s: headers %v", c.url, r.Header)
		}
		var got []byte
		if r.Body != nil {
			got, _ = io.ReadAll(r.Body)
		}
		if string(got) != c.body {
			t.Fatalf("%s: body %q", c.url, got)
		}
		hash := r.Header.Get("X-Amz-Content-Sha256")
		if c.wantHash != "" && hash != c.wantHash || c.wantHash == "" && hash != "" {
			t.Fatalf("%s: x-amz-content-sha256 %q", c.url, hash)
		}
		// The signature checks out, re-signed from the signed headers only.
		payload := hash
		if payload == "" {
			sum := sha256.Sum256([]byte(c.body))
			payload = hex.EncodeToString(sum[:])
		}
		if err := ststest.CheckSignature(r, creds, c.service, payload); err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
	}
}

// TestSignAWSReplacedSecret: a secret replaced under the same access key id
// signs with the new secret at once, not after the signer's key cache
// expires.
func TestSignAWSReplacedSecret(t *testing.T) {
	at := time.Now()
	for _, secret := range []string{"old-secret", "new-secret"} {
		creds := aws.Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: secret}
		r, _ := http.NewRequest(http.MethodGet, "https://sqs.us-east-1.amazonaws.com/?Action=ListQueues", nil)
		if err := signAWS(context.Background(), r, creds, "sqs", "us-east-1", at); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(nil)
		if err := ststest.CheckSignature(r, creds, "sqs", hex.EncodeToString(sum[:])); err != nil {
			t.Fatalf("signed with %s: %v", secret, err)
		}
	}
}
