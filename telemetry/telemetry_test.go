package telemetry

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// The standard variables decide: off without any, on with an endpoint, and refused (naming the
// variable) when they ask for what kvgate cannot do.
func TestSetupFollowsOTELVariables(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		env     []string
		on      bool
		errWith string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"exporter otlp", []string{"OTEL_TRACES_EXPORTER", "otlp"}, true, ""},
		{"exporter none wins", []string{"OTEL_TRACES_EXPORTER", "none", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"}, false, ""},
		{"sdk disabled", []string{"OTEL_SDK_DISABLED", "true", "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"}, false, ""},
		{"grpc refused", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{"traces protocol wins", []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"}, true, ""},
		{"zipkin refused", []string{"OTEL_TRACES_EXPORTER", "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := Setup(ctx, env(c.env...), "test")
			if c.errWith != "" {
				if err == nil || !strings.Contains(err.Error(), c.errWith) {
					t.Fatalf("want an error naming %s, got %v", c.errWith, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tr != nil) != c.on {
				t.Fatalf("tracing on = %v, want %v", tr != nil, c.on)
			}
			if err := tr.Shutdown(ctx); err != nil { // nil-safe when off
				t.Fatal(err)
			}
		})
	}
}

func TestTraceparent(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})
	if got := Traceparent(sc); got != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("traceparent %q", got)
	}
	if Traceparent(trace.SpanContext{}) != "" {
		t.Fatal("an invalid span context has no traceparent")
	}
}
