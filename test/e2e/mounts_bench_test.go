package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// BenchmarkS3MountVsDisk compares, inside a gVisor sandbox, an S3 mount
// (versitygw on loopback, write-back cache of 30 s, reads from a warm
// cache) with the sandbox's own disk: sequential write and read of 64 MiB
// and 200 small files created, listed with stat and removed. It reports
// each figure for both and the mount/disk time ratio.
func BenchmarkS3MountVsDisk(b *testing.B) {
	srv := mountstest.StartS3(b, "bkt")
	ref := testImage(b)
	d := startDaemonArgs(b, "gvisor", "", "--mounts-allow-loopback")
	c := d.Client
	sn := readySnapshot(b, c, "bench", ref)
	cfg := fmt.Sprintf(`{"auth":{"aws":{"access_key_id":{"type":"opaque","value":%q},"secret_access_key":{"type":"opaque","value":%q}}},
		"mounts":[{"id":"d","type":"s3","mount_path":"/data","cache":{"writeback_seconds":30},"s3":{"endpoint_url":%q,"bucket":"bkt","path_style":true}}]}`,
		srv.AccessKey, srv.SecretKey, srv.Endpoint)
	sb := newSandbox(b, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.MountConfig = []byte(cfg) })
	timed := func(cmd string) time.Duration {
		t0 := time.Now()
		mustRun(b, c, sb.Name, cmd)
		return time.Since(t0)
	}
	const mib = 64
	ops := []struct{ name, cmd string }{
		{"seqwrite", "dd if=/dev/zero of=%[1]s/big bs=1M count=64 2>/dev/null"},
		{"seqread-warm", "cat %[1]s/big > /dev/null"},
		{"smallfiles", "mkdir %[1]s/s && i=0; while [ $i -lt 200 ]; do echo $i > %[1]s/s/f$i; i=$((i+1)); done; ls -l %[1]s/s > /dev/null; rm -r %[1]s/s"},
	}
	sums := map[string]time.Duration{}
	for b.Loop() {
		for _, where := range []string{"/data", "/tmp/disk"} {
			mustRun(b, c, sb.Name, "mkdir -p /tmp/disk; rm -rf "+where+"/big")
			for _, op := range ops {
				if op.name == "seqread-warm" {
					timed(fmt.Sprintf(op.cmd, where)) // the first read fills the cache
				}
				sums[op.name+where] += timed(fmt.Sprintf(op.cmd, where))
			}
		}
	}
	n := float64(b.N)
	for _, op := range ops {
		mount, disk := sums[op.name+"/data"].Seconds()/n, sums[op.name+"/tmp/disk"].Seconds()/n
		if op.name == "smallfiles" {
			b.ReportMetric(mount*1000, op.name+"-mount-ms")
			b.ReportMetric(disk*1000, op.name+"-disk-ms")
		} else {
			b.ReportMetric(mib/mount, op.name+"-mount-MB/s")
			b.ReportMetric(mib/disk, op.name+"-disk-MB/s")
		}
		b.ReportMetric(mount/disk, op.name+"-mount/disk-time")
	}
	b.ReportMetric(0, "ns/op")
}
