package telemetry

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// recording is Discard with its spans kept in memory.
func recording() (*Telemetry, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	t := Discard()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.tp, t.tracer = tp, tp.Tracer("test")
	return t, rec
}

func byName(rec *tracetest.SpanRecorder) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		out[s.Name()] = s
	}
	return out
}

func TestPhasesAreChildrenOfTheirOperation(t *testing.T) {
	tel, rec := recording()
	ctx, end := tel.Begin(context.Background(), "create", "sb1")
	t0 := time.Now().Add(-time.Second)
	tel.Phase(ctx, "create", "agent", t0, t0.Add(10*time.Millisecond))
	end(nil)
	spans := byName(rec)
	op, phase := spans["sandbox.create"], spans["boot.agent"]
	if op == nil || phase == nil || phase.Parent().SpanID() != op.SpanContext().SpanID() {
		t.Fatalf("spans %v: want boot.agent under sandbox.create", spans)
	}
	if !phase.StartTime().Equal(t0) || phase.EndTime().Sub(phase.StartTime()) != 10*time.Millisecond {
		t.Errorf("boot.agent ran %v..%v, want the phase's own times", phase.StartTime(), phase.EndTime())
	}
}

func TestEgressRequestContinuesTheSandboxTrace(t *testing.T) {
	tel, rec := recording()
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	_, end := tel.Request(context.Background(), h, "sb1", "GET", "example.test")
	end(http.StatusForbidden)
	s := byName(rec)["egress GET"]
	if s == nil || s.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("egress span %v does not continue the sandbox's trace", s)
	}
	if s.Status().Code.String() != "Error" {
		t.Errorf("a 403 egress span has status %v, want Error", s.Status())
	}
}
