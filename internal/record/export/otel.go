package export

import (
	"context"
	"encoding/json"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	otellog "go.opentelemetry.io/otel/log"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/resource"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// OTelEnabled reports whether the standard variables name an OTLP logs
// endpoint (OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT)
// and the SDK is not disabled (OTEL_SDK_DISABLED, OTEL_LOGS_EXPORTER=none).
func OTelEnabled(getenv func(string) string) bool {
	if getenv("OTEL_LOGS_EXPORTER") == "none" || getenv("OTEL_SDK_DISABLED") == "true" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT") != ""
}

// OTel emits each event as an OpenTelemetry log record: event name the
// event's type, body the event's JSON (as JSONL writes it), and the
// attributes cubicle.sandbox_id, cubicle.workspace_id, cubicle.seq,
// cubicle.step, cubicle.kind and cubicle.actor. Records are batched and
// sent in the background; a collector that is down loses them (the store
// keeps them).
type OTel struct {
	lp     *sdklog.LoggerProvider
	logger otellog.Logger
}

var _ record.Exporter = (*OTel)(nil)

// NewOTel exports over OTLP/HTTP, configured (endpoint, headers, TLS,
// timeout, resource) by the standard OTEL_* variables.
func NewOTel(ctx context.Context) (*OTel, error) {
	exp, err := otlploghttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit export: OTLP log exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", "cubicle")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("audit export: OTLP resource: %w", err)
	}
	return newOTel(sdklog.NewLoggerProvider(sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)), sdklog.WithResource(res))), nil
}

func newOTel(lp *sdklog.LoggerProvider) *OTel {
	return &OTel{lp: lp, logger: lp.Logger("github.com/cubicle-dev/cubicle/audit")}
}

// Export emits evs.
func (o *OTel) Export(evs []protocol.AuditEvent) {
	ctx := context.Background()
	for i := range evs {
		ev := &evs[i]
		b, err := json.Marshal(ev)
		if err != nil {
			continue
		}
		var r otellog.Record
		r.SetTimestamp(ev.Time)
		r.SetObservedTimestamp(ev.Time)
		r.SetEventName(ev.Type)
		r.SetSeverity(otellog.SeverityInfo)
		r.SetBody(attribute.StringValue(string(b)))
		r.AddAttributes(
			attribute.String("cubicle.sandbox_id", ev.SandboxID),
			attribute.String("cubicle.workspace_id", ev.WorkspaceID),
			attribute.Int64("cubicle.seq", ev.Seq),
			attribute.Int64("cubicle.step", ev.Step),
			attribute.String("cubicle.kind", ev.Kind),
			attribute.String("cubicle.actor", ev.Actor.User),
		)
		o.logger.Emit(ctx, r)
	}
}

// Close sends what is batched and stops.
func (o *OTel) Close() error { return o.lp.Shutdown(context.Background()) }
