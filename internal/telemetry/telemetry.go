// Package telemetry is the daemon's metrics, traces and request-scoped
// logging: one Prometheus registry (never the global one) served at
// /metrics, an OpenTelemetry tracer provider exporting over OTLP when the
// standard OTEL_EXPORTER_OTLP_* variables name an endpoint (a no-op one
// otherwise), and the middleware that gives every API request its request
// id, span and metrics.
//
// The lifecycle core does not import this package: it reports through
// the narrow sandbox.Observer hook, which Telemetry implements.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Telemetry holds the daemon's registry and tracer provider. Its methods
// are safe for concurrent use.
type Telemetry struct {
	reg      *prometheus.Registry
	tp       trace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	shutdown func(context.Context) error
	m        *metrics
}

// Option configures New.
type Option func(*options)

type options struct {
	getenv func(string) string
}

// WithGetenv replaces os.Getenv as the source of the OTEL_* variables (tests).
func WithGetenv(f func(string) string) Option { return func(o *options) { o.getenv = f } }

// New returns the daemon's telemetry. Tracing is on when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (and OTEL_TRACES_EXPORTER is not "none"); the exporter (OTLP over HTTP),
// the sampler (OTEL_TRACES_SAMPLER) and the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES) are configured by the SDK from the same
// standard variables. Call Shutdown to flush spans.
func New(ctx context.Context, opts ...Option) (*Telemetry, error) {
	o := options{getenv: os.Getenv}
	for _, opt := range opts {
		opt(&o)
	}
	t := &Telemetry{reg: prometheus.NewRegistry(), prop: propagation.TraceContext{},
		tp: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
	t.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	t.m = newMetrics(t.reg)
	if tracingEnabled(o.getenv) {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
		}
		res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "cubicle")),
			resource.WithFromEnv(), resource.WithTelemetrySDK())
		if err != nil {
			return nil, fmt.Errorf("telemetry: trace resource: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		t.tp, t.shutdown = tp, tp.Shutdown
	}
	t.tracer = t.tp.Tracer("github.com/cubicle-dev/cubicle")
	return t, nil
}

// Discard is telemetry that records metrics in a private registry and
// traces nothing: the default of components built without one.
func Discard() *Telemetry {
	t, _ := New(context.Background(), WithGetenv(func(string) string { return "" }))
	return t
}

func tracingEnabled(getenv func(string) string) bool {
	if getenv("OTEL_TRACES_EXPORTER") == "none" || getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Tracing reports whether spans are exported.
func (t *Telemetry) Tracing() bool {
	_, noopTP := t.tp.(noop.TracerProvider)
	return !noopTP
}

// Registry is the registry /metrics serves; components register their
// collectors on it.
func (t *Telemetry) Registry() *prometheus.Registry { return t.reg }

// TracerProvider is the provider every span of the daemon comes from.
func (t *Telemetry) TracerProvider() trace.TracerProvider { return t.tp }

// Propagator reads and writes W3C traceparent headers.
func (t *Telemetry) Propagator() propagation.TextMapPropagator { return t.prop }

// MetricsHandler serves the registry in the Prometheus text format. It does
// no authentication: callers mount it behind their own.
func (t *Telemetry) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(t.reg, promhttp.HandlerOpts{Registry: t.reg})
}

// Shutdown flushes and stops span export.
func (t *Telemetry) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }
