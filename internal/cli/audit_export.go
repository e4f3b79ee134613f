package cli

import (
	"context"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/record/export"
)

// auditExportFlags configure where the audit record is exported besides
// the store.
type auditExportFlags struct {
	targets []string
	maxMiB  int
	files   int
}

func addAuditExportFlags(fl *pflag.FlagSet, f *auditExportFlags) {
	fl.StringSliceVar(&f.targets, "audit-export", nil,
		"jsonl:PATH: also write every audit record event to PATH as one JSON line, rotated by size (repeatable); OpenTelemetry logs export is on when OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set")
	fl.IntVar(&f.maxMiB, "audit-export-max-mib", export.DefaultMaxMiB, "size in MiB at which a jsonl audit export file is rotated")
	fl.IntVar(&f.files, "audit-export-files", export.DefaultFiles, "jsonl audit export files kept, the live one included")
}

// auditExporters opens the configured exporters. On error those opened
// are closed.
func auditExporters(ctx context.Context, f auditExportFlags, log *slog.Logger) ([]record.Exporter, error) {
	var out []record.Exporter
	fail := func(err error) ([]record.Exporter, error) {
		for _, x := range out {
			_ = x.Close()
		}
		return nil, err
	}
	for _, t := range f.targets {
		_, path, err := export.ParseTarget(t)
		if err != nil {
			return fail(err)
		}
		j, err := export.NewJSONL(path, f.maxMiB, f.files, log)
		if err != nil {
			return fail(err)
		}
		out = append(out, j)
		log.Info("audit record exported", "jsonl", path, "max_mib", f.maxMiB, "files", f.files)
	}
	if export.OTelEnabled(os.Getenv) {
		o, err := export.NewOTel(ctx)
		if err != nil {
			return fail(err)
		}
		out = append(out, o)
		log.Info("audit record exported as OpenTelemetry logs")
	}
	return out, nil
}
