package awssts_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/awssts"
	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
)

// TestAssumeRole: a call signed with the base keys gets the temporary
// ones with their expiry; STS sees the role, session, external id and
// tags; wrong keys and STS errors come back with STS's code.
func TestAssumeRole(t *testing.T) {
	base := aws.Credentials{AccessKeyID: "BASEAK", SecretAccessKey: "basesecret"}
	temp := aws.Credentials{AccessKeyID: "ASIATEMP", SecretAccessKey: "tempsecret", SessionToken: "tok"}
	sts := ststest.Start(t, base, temp, time.Hour)
	role := awssts.Role{ARN: "arn:aws:iam::123456789012:role/app", SessionName: "cubicle-sb1", ExternalID: "ws-1",
		Tags: map[string]string{"team": "blue", "env": "ci"}}
	ctx := context.Background()
	endpoint, region := awssts.Endpoint(sts.URL, "eu-west-1")
	got, err := awssts.AssumeRole(ctx, http.DefaultClient, endpoint, region, role.Form(), base)
	if err != nil {
		t.Fatal(err)
	}
	if got.AccessKeyID != "ASIATEMP" || got.SecretAccessKey != "tempsecret" || got.SessionToken != "tok" || !got.CanExpire ||
		got.Expires.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("credentials = %+v", got)
	}
	calls := sts.Calls()
	want := url.Values{"Action": {"AssumeRole"}, "Version": {"2011-06-15"}, "RoleArn": {role.ARN}, "RoleSessionName": {"cubicle-sb1"},
		"ExternalId": {"ws-1"}, "DurationSeconds": {"3600"}, "Tags.member.1.Key": {"env"}, "Tags.member.1.Value": {"ci"},
		"Tags.member.2.Key": {"team"}, "Tags.member.2.Value": {"blue"}}
	if len(calls) != 1 || calls[0].Encode() != want.Encode() {
		t.Fatalf("STS saw %v, want %v", calls, want)
	}
	for _, bad := range []aws.Credentials{{AccessKeyID: "BASEAK", SecretAccessKey: "wrong"}, {AccessKeyID: "OTHER", SecretAccessKey: "basesecret"}} {
		if _, err := awssts.AssumeRole(ctx, http.DefaultClient, endpoint, region, role.Form(), bad); err == nil ||
			!strings.Contains(err.Error(), "403") || strings.Contains(err.Error(), bad.SecretAccessKey) {
			t.Fatalf("AssumeRole with %s: %v, want STS's 403 without the secret", bad.AccessKeyID, err)
		}
	}
	if n := len(sts.Calls()); n != 1 {
		t.Fatalf("STS granted %d calls, want 1", n)
	}
	malformed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>A</AccessKeyId></Credentials></AssumeRoleResult></AssumeRoleResponse>`))
	}))
	defer malformed.Close()
	if _, err := awssts.AssumeRole(ctx, http.DefaultClient, malformed.URL, region, role.Form(), base); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Fatalf("answer without a secret: %v", err)
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct{ override, region, endpoint, signing string }{
		{"http://127.0.0.1:9/", "eu-west-1", "http://127.0.0.1:9/", "eu-west-1"},
		{"", "eu-west-1", "https://sts.eu-west-1.amazonaws.com/", "eu-west-1"},
		{"", "", "https://sts.amazonaws.com/", "us-east-1"},
	} {
		if e, r := awssts.Endpoint(tc.override, tc.region); e != tc.endpoint || r != tc.signing {
			t.Errorf("Endpoint(%q, %q) = %s %s", tc.override, tc.region, e, r)
		}
	}
}

func TestCheck(t *testing.T) {
	if awssts.CheckARN("arn:aws:iam::123456789012:role/a/b") != nil || awssts.CheckARN("arn:aws:iam::1234:role/a") == nil ||
		awssts.CheckARN("arn:aws:iam::123456789012:user/a") == nil {
		t.Fatal("CheckARN")
	}
	if awssts.CheckTags(map[string]string{"k": ""}) != nil || awssts.CheckTags(map[string]string{"": "v"}) == nil ||
		awssts.CheckTags(map[string]string{"k": strings.Repeat("v", 257)}) == nil {
		t.Fatal("CheckTags")
	}
}
