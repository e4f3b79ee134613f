package telemetry

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Span attribute keys the daemon sets.
const (
	AttrSandbox   = attribute.Key("cubicle.sandbox.id")
	AttrCommand   = attribute.Key("cubicle.command.id")
	AttrWorkspace = attribute.Key("cubicle.workspace")
	AttrOp        = attribute.Key("cubicle.op")
)

// metrics are the daemon's own instruments (the scrape-time collectors
// are in collectors.go).
type metrics struct {
	opDuration   *prometheus.HistogramVec // op, phase ("total" for the whole op)
	opErrors     *prometheus.CounterVec   // op
	execs        *prometheus.CounterVec   // transport
	execDuration *prometheus.HistogramVec // transport
	execActive   prometheus.Gauge
	egress       *prometheus.CounterVec // kind, verdict
	egressBytes  *prometheus.CounterVec // direction
	pulls        *prometheus.CounterVec // result
	pullBytes    prometheus.Counter
	requests     *prometheus.CounterVec   // route, code
	reqDuration  *prometheus.HistogramVec // route
	poolClaims   *prometheus.CounterVec   // snapshot, result (hit, miss)
	poolClaimDur prometheus.Histogram
	poolReady    *prometheus.GaugeVec // snapshot
}

// durationBuckets span a fast exec (ms) to a slow image boot (a minute).
var durationBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(reg prometheus.Registerer) *metrics {
	hist := func(name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "cubicle", Name: name, Help: help, Buckets: durationBuckets}, labels)
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cubicle", Name: name, Help: help}, labels)
	}
	m := &metrics{
		opDuration:   hist("sandbox_operation_duration_seconds", "Duration of sandbox operations (create, start, stop, capture, fork); phase is a boot phase or total.", "op", "phase"),
		opErrors:     counter("sandbox_operation_errors_total", "Sandbox operations that failed.", "op"),
		execs:        counter("exec_total", "Commands run.", "transport"),
		execDuration: hist("exec_duration_seconds", "Duration of commands, from request to exit.", "transport"),
		execActive:   prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cubicle", Name: "exec_active_streams", Help: "Commands running now."}),
		egress:       counter("egress_requests_total", "Egress proxy decisions; verdict is allowed or denied.", "kind", "verdict"),
		egressBytes:  counter("egress_bytes_total", "Bytes through the egress proxy; direction is up (sent by sandboxes) or down.", "direction"),
		pulls:        counter("image_pulls_total", "Image pulls; result is ok or error.", "result"),
		pullBytes:    prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cubicle", Name: "image_pull_bytes_total", Help: "Bytes of image layers pulled."}),
		requests:     counter("http_requests_total", "API requests by route pattern and status code.", "route", "code"),
		reqDuration:  hist("http_request_duration_seconds", "API request duration by route pattern.", "route"),
		poolClaims:   counter("pool_claims_total", "Creates from a snapshot with a warm pool; result is hit (took a pool instance) or miss (booted cold).", "snapshot", "result"),
		poolClaimDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cubicle", Name: "pool_claim_duration_seconds",
			Help: "Time to bind a claimed warm-pool instance to its record.", Buckets: durationBuckets}),
		poolReady: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "cubicle", Name: "pool_ready_instances",
			Help: "Warm-pool instances ready to be claimed, by snapshot."}, []string{"snapshot"}),
	}
	reg.MustRegister(m.opDuration, m.opErrors, m.execs, m.execDuration, m.execActive, m.egress, m.egressBytes,
		m.pulls, m.pullBytes, m.requests, m.reqDuration, m.poolClaims, m.poolClaimDur, m.poolReady)
	return m
}

// Begin implements sandbox.Observer: a span for op on sandbox id (child of
// the request's) and its total duration.
func (t *Telemetry) Begin(ctx context.Context, op, id string) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := t.tracer.Start(ctx, "sandbox."+op, trace.WithAttributes(AttrOp.String(op), AttrSandbox.String(id)))
	return ctx, func(err error) {
		t.m.opDuration.WithLabelValues(op, "total").Observe(time.Since(start).Seconds())
		endSpan(span, err)
		if err != nil {
			t.m.opErrors.WithLabelValues(op).Inc()
		}
	}
}

// Phase implements sandbox.Observer: the phase's duration and a child span
// of the operation's, with the phase's own start and end.
func (t *Telemetry) Phase(ctx context.Context, op, phase string, start, end time.Time) {
	t.m.opDuration.WithLabelValues(op, phase).Observe(end.Sub(start).Seconds())
	_, span := t.tracer.Start(ctx, "boot."+phase, trace.WithTimestamp(start))
	span.End(trace.WithTimestamp(end))
}

// PoolClaim implements sandbox.PoolObserver.
func (t *Telemetry) PoolClaim(snapshot string, hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	t.m.poolClaims.WithLabelValues(snapshot, result).Inc()
}

// PoolClaimed implements sandbox.PoolObserver.
func (t *Telemetry) PoolClaimed(took time.Duration) { t.m.poolClaimDur.Observe(took.Seconds()) }

// PoolSize implements sandbox.PoolObserver.
func (t *Telemetry) PoolSize(snapshot string, ready int) {
	t.m.poolReady.WithLabelValues(snapshot).Set(float64(ready))
}

// Exec counts a command sent over transport (http or ws) to sandbox
// sandboxID and starts its span; end records its duration with the
// command's exit code (-1: not known, e.g. a relayed WebSocket stream)
// and error (nil for any exit code).
func (t *Telemetry) Exec(ctx context.Context, transport, sandboxID, commandID string) (context.Context, func(exitCode int, err error)) {
	start := time.Now()
	t.m.execs.WithLabelValues(transport).Inc()
	t.m.execActive.Inc()
	ctx, span := t.tracer.Start(ctx, "exec", trace.WithAttributes(AttrSandbox.String(sandboxID), AttrCommand.String(commandID),
		attribute.String("cubicle.exec.transport", transport)))
	return ctx, func(code int, err error) {
		t.m.execActive.Dec()
		t.m.execDuration.WithLabelValues(transport).Observe(time.Since(start).Seconds())
		if code >= 0 {
			span.SetAttributes(attribute.Int("process.exit.code", code))
		}
		endSpan(span, err)
	}
}

// Egress counts one egress proxy decision of kind (http, https, tls, dns).
func (t *Telemetry) Egress(kind string, allowed bool) {
	verdict := "denied"
	if allowed {
		verdict = "allowed"
	}
	t.m.egress.WithLabelValues(kind, verdict).Inc()
}

// EgressBytes counts bytes relayed by the egress proxy.
func (t *Telemetry) EgressBytes(up, down int64) {
	t.m.egressBytes.WithLabelValues("up").Add(float64(up))
	t.m.egressBytes.WithLabelValues("down").Add(float64(down))
}

// Request implements proxy.Meter: a span for one egress HTTP request of
// sandbox id, continuing the trace of a traceparent the sandbox sent (so
// an agent's own trace shows its outbound calls).
func (t *Telemetry) Request(ctx context.Context, h http.Header, id, method, host string) (context.Context, func(int)) {
	ctx = t.prop.Extract(ctx, propagation.HeaderCarrier(h))
	ctx, span := t.tracer.Start(ctx, "egress "+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrSandbox.String(id), attribute.String("server.address", host), attribute.String("http.request.method", method)))
	return ctx, func(status int) {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if status >= 400 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
		span.End()
	}
}

// ImagePull counts one image pull of bytes layer bytes ending with err.
func (t *Telemetry) ImagePull(bytes int64, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	t.m.pulls.WithLabelValues(result).Inc()
	t.m.pullBytes.Add(float64(bytes))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
