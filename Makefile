# kvgate — the two commands that matter are `make demo` and `make test`.
GO      ?= go
BIN     ?= bin/kvgate
LAB_BIN ?= bin/kvgate-lab
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Tests share one Redis (db 15, unique key prefixes); override to point elsewhere.
export KVGATE_TEST_REDIS ?= redis://127.0.0.1:6379/15

.PHONY: build test demo bench bench-quick bench-proxy bench-compare bench-micro fuzz soak lint docker clean tools helm promtool chart screenshot falsealarm bench-scanner

# The product binary (kvgate) and the lab's (kvgate-lab: simulator, leak lab, demo), which the
# product never links. -buildvcs=auto stamps the git revision (kvgate_build_info) even where
# GOFLAGS says -buildvcs=false, and skips it outside a repository (the Docker build).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kvgate
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags '$(LDFLAGS)' -o $(LAB_BIN) ./cmd/kvgate-lab

# Packages run one at a time (-p 1): the machine has two cores and the end-to-end tests start
# real simulator processes whose timing they measure.
test: build
	KVGATE_BIN=$(CURDIR)/$(BIN) KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) $(GO) test -count=1 -p 1 -timeout 20m ./...

demo: build
	$(LAB_BIN) demo

# Issue 33 first (the proxy alone on its own core: CPU per request and per event from /proc, see
# bench-proxy), then issue 9: kvgate side by side with the simulator direct, nginx (if installed) and a bare fasthttp
# proxy, rounds interleaved, then a concurrency sweep, streams, the RSS of 10,000 slow streams and
# the micro-benchmarks; a table on stdout and lab/bench/results/latest.json (see BENCHMARKS.md).
# Run nothing else heavy at the same time. bench-quick is the same in under a minute.
BENCH_BIN ?= bin/kvgate-bench

bench: build
	$(GO) build -o $(BENCH_BIN) ./lab/bench
	KVGATE_BIN=$(CURDIR)/$(BIN) KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) $(BENCH_BIN) -kvgate $(BIN) -lab $(LAB_BIN)

bench-quick: build
	$(GO) build -o $(BENCH_BIN) ./lab/bench
	KVGATE_BIN=$(CURDIR)/$(BIN) KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) $(BENCH_BIN) -quick -kvgate $(BIN) -lab $(LAB_BIN)

# Issue 33, the first phase of make bench on its own: each party pinned to its own cores with
# taskset (the proxy alone on one), the proxy's CPU time per request and per event from /proc for
# nginx, the bare proxy and kvgate (memory, Redis; canaries off, on), then large prompts (Qwen3's
# tokenizer from .cache/npm, cl100k). PROXY_CORES gives the proxy more cores.
PROXY_CORES ?= 1
bench-proxy: build
	$(GO) build -o $(BENCH_BIN) ./lab/bench
	KVGATE_BIN=$(CURDIR)/$(BIN) KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) $(BENCH_BIN) -phases proxy -proxy-cores $(PROXY_CORES) -kvgate $(BIN) -lab $(LAB_BIN) -out lab/bench/results/proxy.json

# The gateway's per-request and per-event costs of BASE and of the work tree, rounds interleaved
# in one run, side by side with their ratio (scripts/bench-compare.sh).
BASE ?= f8755d9
bench-compare:
	BENCHTIME=20000x scripts/bench-compare.sh $(BASE) 3

# Every go-test benchmark of the packages, at their default benchtime (long: tens of minutes).
bench-micro: build
	KVGATE_BIN=$(CURDIR)/$(BIN) KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) $(GO) test -run '^$$' -bench . -benchmem -timeout 30m ./tokenize/ ./canary/ ./policy/ ./state/ ./gateway/ ./lab/enginesim/

# Every fuzz target, FUZZTIME each (make test replays their corpora under testdata/fuzz).
FUZZTIME ?= 15s
FUZZ_TARGETS := tokenize:FuzzCount tokenize/bpe:FuzzCountPiece tokenize/bpe:FuzzChunkedCount tokenize/bpe:FuzzSplitter canary:FuzzScanner canary:FuzzLoose request:FuzzParseRequest request:FuzzCheckKeys \
	reply:FuzzEventRelay reply:FuzzJSONValue gateway:FuzzHostileEngine internal/sse:FuzzParser backends:FuzzDecodeCapacity backends:FuzzTokenizeCount backends:FuzzSumField \
	backends:FuzzSumGauge config:FuzzParse lab/enginesim/wire:FuzzParseGenerate lab/enginesim/wire:FuzzParseOpenAI lab/enginesim:FuzzRouteBodies \
	tokenize/imagesize:FuzzRead
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s ./$$pkg/; done

# Not in make test: 10,000 concurrent streams for 60 s through a kvgate serve process to
# simulator processes, then errors, RSS and goroutines before and after (lab/soak).
SOAK_STREAMS ?= 10000
SOAK_DURATION ?= 60s
soak: build
	$(GO) run ./lab/soak --kvgate $(CURDIR)/$(BIN) --lab $(CURDIR)/$(LAB_BIN) --streams $(SOAK_STREAMS) --duration $(SOAK_DURATION)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

# Not built in CI (no Docker engine there); see the Dockerfile's header.
docker:
	docker build -t kvgate:$(VERSION) --build-arg VERSION=$(VERSION) .

# Tools the deploy/ tests use, built once from the Go module proxy into $(go env GOPATH)/bin
# (helm: about 3.5 minutes on 2 cores). make test uses them when present; .ci/run installs them
# first, and in CI (CI=true) the tests fail without them.
GOBIN_DIR := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
HELM_VERSION ?= v4.3.2
PROMTOOL_VERSION ?= v0.316.0
tools: helm promtool
helm:
	@test -x $(GOBIN_DIR)/helm || $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)
promtool:
	@test -x $(GOBIN_DIR)/promtool || $(GO) install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)

# The chart's lint and render (also checked by make test: deploy/helm).
chart: helm
	$(GOBIN_DIR)/helm lint --strict deploy/helm/kvgate
	$(GOBIN_DIR)/helm template kvgate deploy/helm/kvgate -f deploy/helm/testdata/full-values.yaml

# docs/status-page.png, from the status page test in headless chromium.
screenshot: build
	KVGATE_LAB_BIN=$(CURDIR)/$(LAB_BIN) STATUS_PAGE_SCREENSHOT=$(CURDIR)/docs/status-page.png \
		$(GO) test -count=1 -run TestStatusPageInChromium ./admin/ui/

clean:
	rm -rf bin

# Issue 17: false alarms of the folded detector on 1 GB of the machine's natural text against
# 10^5 live markers (minutes; not part of make test). Numbers in SECURITY.md.
falsealarm:
	KVGATE_FALSEALARM_BYTES=1e9 $(GO) test -count=1 -run TestFalseAlarmsOnNaturalText -timeout 60m -v ./canary

# Issue 17: the folded detector today and before, side by side, 10^2 to 10^6 live markers.
bench-scanner:
	$(GO) test -run '^$$' -bench BenchmarkScannerSideBySide -benchtime 10x -timeout 30m ./canary
