// Package telemetry sets up OpenTelemetry tracing from the standard OTEL_* environment variables:
// spans exported over OTLP/HTTP (protobuf) when an endpoint is named, nothing at all otherwise.
// It knows nothing of requests: the gateway starts and ends its spans itself.
package telemetry

import (
	"context"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is the process's tracer; a nil *Tracing is tracing off.
type Tracing struct {
	Tracer   trace.Tracer
	provider *sdktrace.TracerProvider
}

// Propagator reads and writes W3C trace context (traceparent, tracestate).
var Propagator = propagation.TraceContext{}

// Setup builds the tracer the OTEL_* variables ask for (getenv is os.LookupEnv in the binary):
//   - off (nil, nil) unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
//     set, or OTEL_TRACES_EXPORTER is otlp; OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true
//     turn it off whatever else is set;
//   - the exporter is OTLP over HTTP with protobuf bodies, configured by the exporter's own
//     variables (endpoint, headers, timeout, compression, certificates); a protocol other than
//     http/protobuf, or an exporter other than otlp, is an error naming the variable;
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the process (service.name defaults to
//     kvgate), OTEL_TRACES_SAMPLER(_ARG) sample and OTEL_BSP_* batch, as the SDK reads them.
func Setup(ctx context.Context, getenv func(string) (string, bool), version string) (*Tracing, error) {
	get := func(k string) string { v, _ := getenv(k); return strings.TrimSpace(v) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	switch exp := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return nil, nil
	case "otlp":
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: kvgate exports traces over otlp only (or none)", exp)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := get(k); p != "" {
			if p != "http/protobuf" {
				return nil, fmt.Errorf("%s=%s: kvgate exports over http/protobuf only", k, p)
			}
			break // the traces-specific variable wins over the general one
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(attribute.String("service.name", "kvgate"), attribute.String("service.version", version)),
		resource.Environment(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Tracer: tp.Tracer("github.com/kvgate/kvgate", trace.WithInstrumentationVersion(version)), provider: tp}, nil
}

// Shutdown exports the spans still queued and stops the exporter (bounded by ctx).
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Traceparent is the W3C traceparent header value of sc ("" when sc is not valid).
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}
