package proxy

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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// An aws rule with role_arn is served with temporary credentials from STS
// AssumeRole, called by the daemon with the workspace's base credentials;
// the session is tagged with the rule's session_tags and carries the
// workspace id as ExternalId, so a role's trust policy can pin it to one
// workspace. Credentials are cached until shortly before they expire.

// roleSessionTTL is the lifetime asked of STS; credentials are renewed
// roleRenewBefore ahead of their expiry.
const (
	roleSessionTTL  = time.Hour
	roleRenewBefore = 5 * time.Minute
)

// stsEndpoint is where c's role is assumed and the region that is signed
// for: Config.STSEndpoint, else the rule region's STS, else the global one.
func (s *Service) stsEndpoint(c *AWSCredentials) (endpoint, region string) {
	region = c.Region
	if region == "" {
		region = "us-east-1"
	}
	switch {
	case s.cfg.STSEndpoint != "":
		return strings.TrimRight(s.cfg.STSEndpoint, "/") + "/", region
	case c.Region != "":
		return "https://sts." + c.Region + ".amazonaws.com/", region
	}
	return "https://sts.amazonaws.com/", region
}

// assumeRole returns temporary credentials for c's role on behalf of sb.
func (s *Service) assumeRole(ctx context.Context, sb *sandbox, c *AWSCredentials) (aws.Credentials, error) {
	endpoint, region := s.stsEndpoint(c)
	form := url.Values{
		"Action": {"AssumeRole"}, "Version": {"2011-06-15"}, "RoleArn": {c.RoleARN},
		"RoleSessionName": {"cubicle-" + sb.id}, "ExternalId": {sb.workspace},
		"DurationSeconds": {strconv.Itoa(int(roleSessionTTL / time.Second))},
	}
	keys := make([]string, 0, len(c.SessionTags))
	for k := range c.SessionTags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		n := strconv.Itoa(i + 1)
		form.Set("Tags.member."+n+".Key", k)
		form.Set("Tags.member."+n+".Value", c.SessionTags[k])
	}
	body := form.Encode()
	cacheKey := sb.id + "\x00" + endpoint + "\x00" + body
	now := time.Now()
	if creds, ok := s.roles.get(cacheKey, now); ok {
		return creds, nil
	}
	ak, err := s.headerValue(ctx, sb, Header{Type: "workspace_secret", Value: BaseAccessKeySecret})
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("base credentials: %w", err)
	}
	sk, err := s.headerValue(ctx, sb, Header{Type: "workspace_secret", Value: BaseSecretKeySecret})
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("base credentials: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(body))
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	sum := sha256.Sum256([]byte(body))
	base := aws.Credentials{AccessKeyID: strings.TrimSpace(ak), SecretAccessKey: strings.TrimSpace(sk)}
	if err := sigv4.SignHTTP(ctx, base, req, hex.EncodeToString(sum[:]), "sts", region, now); err != nil {
		return aws.Credentials{}, fmt.Errorf("sign sts request: %w", err)
	}
	resp, err := (&http.Client{Transport: sb.transport, Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("sts: read answer: %w", err)
	}
	creds, err := parseAssumeRole(resp.StatusCode, raw)
	if err != nil {
		return aws.Credentials{}, err
	}
	s.roles.put(cacheKey, creds, creds.Expires.Add(-roleRenewBefore), now)
	return creds, nil
}

// parseAssumeRole reads STS's XML answer: the credentials, or the error's
// code and message (which hold no secret).
func parseAssumeRole(status int, raw []byte) (aws.Credentials, error) {
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
