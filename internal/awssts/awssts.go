// Package awssts assumes IAM roles through AWS STS for the daemon: the
// egress proxy's role_arn rules and S3 data mounts with auth.aws.role_arn
// both call it with the workspace's base credentials, and neither the base
// nor the temporary credentials ever reach a sandbox.
package awssts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// The workspace secrets holding the base credentials roles are assumed
// with.
const (
	BaseAccessKeySecret = "AWS_ACCESS_KEY_ID"
	BaseSecretKeySecret = "AWS_SECRET_ACCESS_KEY"
)

// SessionTTL is the lifetime asked of STS; callers renew credentials
// RenewBefore ahead of their expiry.
const (
	SessionTTL  = time.Hour
	RenewBefore = 5 * time.Minute
)

// Limits STS puts on session tags.
const (
	maxTags     = 50
	maxTagKey   = 128
	maxTagValue = 256
)

// roleARNRE matches an IAM role ARN in any partition.
var roleARNRE = regexp.MustCompile(`^arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}$`)

// Role is a role to assume and how the session is named and tagged.
// ExternalID is the workspace id, so a role's trust policy can pin it to
// one workspace.
type Role struct {
	ARN         string
	SessionName string
	ExternalID  string
	Tags        map[string]string
}

// CheckARN says what is wrong with a role_arn, if anything.
func CheckARN(arn string) error {
	if !roleARNRE.MatchString(arn) {
		return fmt.Errorf("%q is not an IAM role ARN", arn)
	}
	return nil
}

// CheckTags says what is wrong with session_tags, if anything.
func CheckTags(tags map[string]string) error {
	if len(tags) > maxTags {
		return fmt.Errorf("at most %d tags", maxTags)
	}
	for k, v := range tags {
		if k == "" || len(k) > maxTagKey || len(v) > maxTagValue {
			return fmt.Errorf("tag %q: keys are 1-%d and values 0-%d characters", k, maxTagKey, maxTagValue)
		}
	}
	return nil
}

// Endpoint is where roles are assumed for region and the region that is
// signed for: override if set, else region's STS, else the global one.
func Endpoint(override, region string) (endpoint, signingRegion string) {
	signingRegion = region
	if signingRegion == "" {
		signingRegion = "us-east-1"
	}
	switch {
	case override != "":
		return strings.TrimRight(override, "/") + "/", signingRegion
	case region != "":
		return "https://sts." + region + ".amazonaws.com/", signingRegion
	}
	return "https://sts.amazonaws.com/", signingRegion
}

// Form is the AssumeRole request body for r; tags are in key order, so
// equal roles give equal bodies (callers cache on it).
func (r Role) Form() string {
	form := url.Values{
		"Action": {"AssumeRole"}, "Version": {"2011-06-15"}, "RoleArn": {r.ARN},
		"RoleSessionName": {r.SessionName}, "ExternalId": {r.ExternalID},
		"DurationSeconds": {strconv.Itoa(int(SessionTTL / time.Second))},
	}
	keys := make([]string, 0, len(r.Tags))
	for k := range r.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		n := strconv.Itoa(i + 1)
		form.Set("Tags.member."+n+".Key", k)
		form.Set("Tags.member."+n+".Value", r.Tags[k])
	}
	return form.Encode()
}

// AssumeRole posts body (a Role's Form) to STS at endpoint, signed for
// region with base, through hc, and returns the temporary credentials.
func AssumeRole(ctx context.Context, hc *http.Client, endpoint, region, body string, base aws.Credentials) (aws.Credentials, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256.Sum256([]byte(body))
	// A signer per call: a signer caches derived keys by access key id
	// alone, so a shared one would go on signing with a replaced secret.
	if err := v4.NewSigner().SignHTTP(ctx, base, req, hex.EncodeToString(sum[:]), "sts", region, time.Now()); err != nil {
		return aws.Credentials{}, fmt.Errorf("sign sts request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts: read answer: %w", err)
	}
	return parse(resp.StatusCode, raw)
}

// parse reads STS's XML answer: the credentials, or the error's code and
// message (which hold no secret).
func parse(status int, raw []byte) (aws.Credentials, error) {
	if status != http.StatusOK {
		var e struct {
			Code    string `xml:"Error>Code"`
			Message string `xml:"Error>Message"`
		}
		_ = xml.NewDecoder(bytes.NewReader(raw)).Decode(&e)
		return aws.Credentials{}, fmt.Errorf("sts answered %d %s: %s", status, e.Code, e.Message)
	}
	var r struct {
		Creds struct {
			AccessKeyID     string `xml:"AccessKeyId"`
			SecretAccessKey string `xml:"SecretAccessKey"`
			SessionToken    string `xml:"SessionToken"`
			Expiration      string `xml:"Expiration"`
		} `xml:"AssumeRoleResult>Credentials"`
	}
	if err := xml.Unmarshal(raw, &r); err != nil {
		return aws.Credentials{}, fmt.Errorf("sts: malformed answer: %v", err)
	}
	exp, err := time.Parse(time.RFC3339, r.Creds.Expiration)
	if err != nil || r.Creds.AccessKeyID == "" || r.Creds.SecretAccessKey == "" || r.Creds.SessionToken == "" {
		return aws.Credentials{}, fmt.Errorf("sts: answer lacks credentials or expiration")
	}
	return aws.Credentials{AccessKeyID: r.Creds.AccessKeyID, SecretAccessKey: r.Creds.SecretAccessKey,
		SessionToken: r.Creds.SessionToken, CanExpire: true, Expires: exp}, nil
}
