package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/awssts"
)

// An aws rule with role_arn is served with temporary credentials from STS
// AssumeRole (internal/awssts), called by the daemon with the workspace's
// base credentials; the session is tagged with the rule's session_tags and
// carries the workspace id as ExternalId, so a role's trust policy can pin
// it to one workspace. Credentials are cached until shortly before they
// expire.

// assumeRole returns temporary credentials for c's role on behalf of sb.
func (s *Service) assumeRole(ctx context.Context, sb *sandbox, c *AWSCredentials) (aws.Credentials, error) {
	endpoint, region := awssts.Endpoint(s.cfg.STSEndpoint, c.Region)
	body := awssts.Role{ARN: c.RoleARN, SessionName: "cubicle-" + sb.id, ExternalID: sb.workspace, Tags: c.SessionTags}.Form()
	cacheKey := sb.id + "\x00" + endpoint + "\x00" + body
	now := time.Now()
	if creds, ok := s.roles.get(cacheKey, now); ok {
		return creds, nil
	}
	ak, err := s.headerValue(ctx, sb, Header{Type: "workspace_secret", Value: awssts.BaseAccessKeySecret})
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("base credentials: %w", err)
	}
	sk, err := s.headerValue(ctx, sb, Header{Type: "workspace_secret", Value: awssts.BaseSecretKeySecret})
	if err != nil {
		return aws.Credentials{}, fmt.Errorf("base credentials: %w", err)
	}
	base := aws.Credentials{AccessKeyID: strings.TrimSpace(ak), SecretAccessKey: strings.TrimSpace(sk)}
	creds, err := awssts.AssumeRole(ctx, &http.Client{Transport: sb.transport, Timeout: 15 * time.Second}, endpoint, region, body, base)
	if err != nil {
		return aws.Credentials{}, err
	}
	s.roles.put(cacheKey, creds, creds.Expires.Add(-awssts.RenewBefore), now)
	return creds, nil
}
