package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/dustin/go-humanize"
)

// streamRSSBound is how far the daemon's RSS may rise over its level
// before a stream while the stream runs: the relay holds one frame per
// stream (the agent's read chunk, base64-encoded in one websocket
// message) or, for an upload, one copy buffer; the rest is Go heap slack
// (GC runs when the heap doubles) and page-cache-free noise.
const streamRSSBound = 48 << 20

// rssWatch samples the daemon's VmRSS every interval until stopped and
// keeps the peak.
type rssWatch struct {
	peak atomic.Int64
	stop chan struct{}
	done chan struct{}
}

func watchRSS(t *testing.T, d *daemon, interval time.Duration) *rssWatch {
	w := &rssWatch{stop: make(chan struct{}), done: make(chan struct{})}
	pid := d.cmd.Process.Pid
	go func() {
		defer close(w.done)
		for {
			if rss, err := procBytes(fmt.Sprintf("/proc/%d/status", pid), "VmRSS"); err == nil && rss > w.peak.Load() {
				w.peak.Store(rss)
			}
			select {
			case <-w.stop:
				return
			case <-time.After(interval):
			}
		}
	}()
	return w
}

// end stops the sampling and returns the peak.
func (w *rssWatch) end() int64 {
	close(w.stop)
	<-w.done
	return w.peak.Load()
}

// stallWriter blocks its first Write until release is closed, then counts
// what it is given.
type stallWriter struct {
	release <-chan struct{}
	n       atomic.Int64
}

func (s *stallWriter) Write(p []byte) (int, error) {
	<-s.release
	s.n.Add(int64(len(p)))
	return len(p), nil
}

// TestExecStreamStalledReader: a client opens an exec stream of a command
// that prints without pause and stops reading for 60 s (its first write of
// output blocks). The daemon's RSS stays within streamRSSBound of where it
// was, the stream delivers again once the client reads, and hanging up
// ends it promptly.
func TestExecStreamStalledReader(t *testing.T) {
	t.Parallel() // a minute of waiting, on a daemon of its own
	ref := testImage(t)
	d := startDaemon(t, runtimes()[0], "")
	sn := readySnapshot(t, d.Client, "stall", ref)
	sb := newSandbox(t, d.Client, sn.ID, nil)
	before := daemonMem(t, d, "VmRSS")
	release := make(chan struct{})
	out := &stallWriter{release: release}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Shell: "/bin/sh", Timeout: -1, Stdout: out,
			Command: "yes 'a line of output that the client does not read for a minute, over and over'"})
		done <- err
	}()
	w := watchRSS(t, d, 500*time.Millisecond)
	stall := 60 * time.Second
	if testing.Short() {
		stall = 10 * time.Second
	}
	time.Sleep(stall)
	during := w.end()
	close(release)
	time.Sleep(2 * time.Second)
	if n := out.n.Load(); n < 1<<20 {
		t.Errorf("the stream delivered %d bytes in the 2 s after the client read again", n)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Logf("exec ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exec still runs 10 s after the client hung up")
	}
	time.Sleep(time.Second)
	after := daemonMem(t, d, "VmRSS")
	t.Logf("daemon RSS: before %s, peak during the %v stall %s, after %s; delivered %s after the stall",
		humanize.IBytes(uint64(before)), stall, humanize.IBytes(uint64(during)), humanize.IBytes(uint64(after)), humanize.IBytes(uint64(out.n.Load())))
	if during-before > streamRSSBound {
		t.Errorf("daemon RSS grew by %s during the stall, bound %s", humanize.IBytes(uint64(during-before)), humanize.IBytes(streamRSSBound))
	}
	if out := mustRun(t, d.Client, sb.Name, "pgrep yes || echo none"); out != "none\n" {
		t.Errorf("the command of the abandoned stream still runs: %q", out)
	}
}

// TestConcurrentExecStreams: 200 exec streams at once against 4 sandboxes
// each get their whole output, in order, and exit code.
func TestConcurrentExecStreams(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, runtimes()[0], "")
	sn := readySnapshot(t, d.Client, "many", ref)
	var names []string
	for range 4 {
		names = append(names, newSandbox(t, d.Client, sn.ID, nil).Name)
	}
	const streams, lines = 200, 500
	var want strings.Builder
	for i := 1; i <= lines; i++ {
		fmt.Fprintf(&want, "line-%d\n", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := daemonMem(t, d, "VmRSS")
	w := watchRSS(t, d, 200*time.Millisecond)
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errb bytes.Buffer
			code, err := d.Client.Exec(ctx, names[i%len(names)], cubicle.ExecRequest{Shell: "/bin/sh", Stdout: &out, Stderr: &errb,
				Command: fmt.Sprintf("sleep 1; i=1; while [ $i -le %d ]; do echo line-$i; i=$((i+1)); done; echo done-%d >&2; exit %d", lines, i, i%7)})
			switch {
			case err != nil:
				errs <- fmt.Errorf("stream %d: %w", i, err)
			case code != i%7:
				errs <- fmt.Errorf("stream %d: exit %d, want %d", i, code, i%7)
			case out.String() != want.String():
				errs <- fmt.Errorf("stream %d: %d bytes of stdout, want %d", i, out.Len(), want.Len())
			case errb.String() != fmt.Sprintf("done-%d\n", i):
				errs <- fmt.Errorf("stream %d: stderr %q", i, errb.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	peak := w.end()
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d streams failed", n, streams)
	}
	t.Logf("%d streams × %d lines on %d sandboxes in %v; daemon RSS before %s, peak %s", streams, lines, len(names),
		time.Since(t0).Round(time.Millisecond), humanize.IBytes(uint64(before)), humanize.IBytes(uint64(peak)))
}

// zeroReader yields n zero bytes without holding them.
type zeroReader struct{ n int64 }

func (z *zeroReader) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := int64(len(p))
	if k > z.n {
		k = z.n
	}
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// uploadBytes is the size TestLargeUpload streams: CUBICLE_UPLOAD_BYTES
// (`make soak` sets 10 GiB), else CI's 2 GiB.
func uploadBytes(t *testing.T) int64 {
	if v := os.Getenv("CUBICLE_UPLOAD_BYTES"); v != "" {
		n, err := humanize.ParseBytes(v)
		if err != nil {
			t.Fatalf("CUBICLE_UPLOAD_BYTES=%q: %v", v, err)
		}
		return int64(n)
	}
	return 2 << 30
}

// TestLargeUpload streams an upload through the file API from a reader
// that makes zeros (nothing on the client's disk) and checks the daemon's
// RSS stays within streamRSSBound of where it was while it streams, and
// that the file arrived whole.
func TestLargeUpload(t *testing.T) {
	ref := testImage(t)
	size := uploadBytes(t)
	d := startDaemon(t, runtimes()[0], "")
	sn := readySnapshot(t, d.Client, "upload", ref)
	sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.FSCapacityBytes = int64p(size + 1<<30) })
	before := daemonMem(t, d, "VmRSS")
	w := watchRSS(t, d, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := d.Client.WriteFile(ctx, sb.Name, "/big", &zeroReader{n: size}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	peak := w.end()
	after := daemonMem(t, d, "VmRSS")
	if got := mustRun(t, d.Client, sb.Name, "stat -c %s /big"); strings.TrimSpace(got) != strconv.FormatInt(size, 10) {
		t.Fatalf("the sandbox holds %s bytes, want %d", strings.TrimSpace(got), size)
	}
	t.Logf("uploaded %s in %v (%s/s); daemon RSS before %s, peak %s, after %s", humanize.IBytes(uint64(size)), took.Round(time.Millisecond),
		humanize.IBytes(uint64(float64(size)/took.Seconds())), humanize.IBytes(uint64(before)), humanize.IBytes(uint64(peak)), humanize.IBytes(uint64(after)))
	if peak-before > streamRSSBound {
		t.Errorf("daemon RSS grew by %s during the upload, bound %s", humanize.IBytes(uint64(peak-before)), humanize.IBytes(streamRSSBound))
	}
}
