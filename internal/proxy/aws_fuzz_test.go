package proxy

import (
	"strings"
	"testing"
)

// FuzzAWSEndpoint feeds arbitrary Host values to the SigV4 endpoint
// parser. It must not panic; it claims only hosts under amazonaws.com(.cn);
// and what it derives is a usable signing scope: a non-empty service and a
// region, neither containing a dot, the region in AWS's form.
func FuzzAWSEndpoint(f *testing.F) {
	for _, h := range []string{
		"s3.us-west-2.amazonaws.com", "my.dotted.bucket.s3.eu-central-1.amazonaws.com",
		"bucket.s3.dualstack.us-east-2.amazonaws.com", "s3-us-west-2.amazonaws.com",
		"sts-fips.us-east-1.amazonaws.com", "iam.amazonaws.com", "lambda.eu-west-3.amazonaws.com.",
		"x.iot.data.us-east-1.amazonaws.com:443", "s3.cn-north-1.amazonaws.com.cn", "amazonaws.com",
		".amazonaws.com", "fips.amazonaws.com", "evil.com", "amazonaws.com.evil.com", "[::1]:443",
	} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, host string) {
		svc, region, ok := AWSEndpoint(host)
		if !ok {
			return
		}
		h := normHost(hostOnly(host))
		if !strings.HasSuffix(h, ".amazonaws.com") && !strings.HasSuffix(h, ".amazonaws.com.cn") {
			t.Fatalf("AWSEndpoint(%q) claimed a host outside AWS", host)
		}
		if svc == "" || strings.Contains(svc, ".") || strings.Contains(region, ".") || !regionRE.MatchString(region) {
			t.Fatalf("AWSEndpoint(%q) = service %q region %q", host, svc, region)
		}
	})
}
