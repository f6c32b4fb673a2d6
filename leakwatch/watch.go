// Package leakwatch is leak detection, one room: the tenant's marker injected into its prompt,
// the echo set (foreign markers the client itself sent, token-id prompts read back), the prompt
// fingerprint index and its shared stream, the reply's scanner (reply.Guard) wired to both
// detectors, incidents with their evidence, and the quarantine of the path. A Watcher is a
// replica's; a Watch is one request's and keeps its own state. It never holds the gateway's
// exchange: the gateway tells a Watch what it needs (the request, the route) and asks it for the
// guard; it writes nothing to a client.
package leakwatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
	"github.com/kvgate/kvgate/tenants"
	"github.com/kvgate/kvgate/tokenize"
)

// Options are what a Watcher is built from.
type Options struct {
	Canary config.Canary
	// ExactTimeout bounds reading a token-id prompt back from an engine (tokenizer.exact_timeout).
	ExactTimeout time.Duration
	// Tenants are the configured tenants' names: their markers are derived at once.
	Tenants []string
	State   *state.State
	// Quarantine applies a backend's quarantine flag to routing (backends.Set.SetQuarantine).
	Quarantine func(until map[string]time.Time)
	Registry   *prometheus.Registry
	Log        *zap.Logger
	// Background runs work off the request path (the gateway's, which waits for it at shutdown).
	Background func(name string, work func(ctx context.Context))
}

// Watcher is a replica's leak detection.
type Watcher struct {
	cfg          config.Canary
	exactTimeout time.Duration
	log          *zap.Logger
	bg           func(name string, work func(ctx context.Context))
	keyring      *canary.Keyring // nil when canaries are disabled
	state        *state.State
	quarantine   *state.Quarantines
	// localEvidence is this replica's own record of prompt-text matches: it decides while the
	// shared one (state.Evidence) is away.
	localEvidence state.TextEvidence

	injected    prometheus.Counter
	skipped     *prometheus.CounterVec
	incidents   *prometheus.CounterVec
	textRefused prometheus.Counter

	// prints: prompt fingerprints of this replica (fingerprints.go); nil when off.
	prints         *fingerprint.Index
	printsWeak     prometheus.Counter
	printsUnshared prometheus.Counter
	printsOut      chan state.PrintsRecord // to the shared stream (nil: replica-local)
	replicaID      string
	printsQueueMu  sync.Mutex // numbers records in the order they enter printsOut
	printsQueued   uint64     // records queued so far (the last one's number)
	printsMu       sync.Mutex
	printsLast     string        // id of the last shared record applied
	printsSettled  uint64        // records numbered up to this one were published (or failed)
	printsTick     chan struct{} // closed (and replaced) when printsSettled moves
	printsDown     atomic.Bool   // the last publish failed: replies do not wait for Redis
	printsWaitLate prometheus.Counter
}

// New builds a replica's Watcher; it starts nothing until Run.
func New(o Options) *Watcher {
	st := o.State
	w := &Watcher{cfg: o.Canary, exactTimeout: o.ExactTimeout, log: o.Log, bg: o.Background, state: st, replicaID: newID()}
	w.quarantine = state.NewQuarantines(st.Quarantine, o.Quarantine)
	w.localEvidence = state.NewMemoryTextEvidence()
	if st.Evidence == nil {
		st.Evidence = w.localEvidence
	}
	if o.Canary.Enabled {
		w.keyring = canary.NewKeyring([]byte(o.Canary.Secret), o.Canary.Epoch, o.Canary.DetectWindow, o.Tenants)
	}
	w.injected = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_canary_injected_total",
		Help: "Requests that carried the tenant's canary marker."})
	w.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_canary_skipped_total",
		Help: "Requests without a marker, by reason (input_ids, opt_out)."}, []string{"reason"})
	w.incidents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvgate_canary_incidents_total",
		Help: "Leaks seen in replies: leak (a foreign marker or another tenant's prompt text: cut or flagged, quarantined as its evidence says) or echo (a marker the requester's own prompt had). A rising echo rate is an alarm too."}, []string{"kind"})
	w.textRefused = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_text_quarantines_refused_total",
		Help: "Corroborated prompt-text matches that quarantined nothing because their requester had already triggered canary.fingerprints.quarantines_per_requester quarantines in the corroboration window."})
	o.Registry.MustRegister(w.injected, w.skipped, w.incidents, w.textRefused)
	w.initPrints(o.Registry)
	return w
}

// newID is a fresh random id (this replica's, in the shared fingerprint stream).
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "kvg-" + hex.EncodeToString(b[:])
}

// Quarantines are the backends' quarantine flags (the admin API's, shared through the store).
func (w *Watcher) Quarantines() *state.Quarantines { return w.quarantine }

// AddTenant derives a new tenant's markers (a run-time tenant, or one a reload added).
func (w *Watcher) AddTenant(name string) {
	if w.keyring != nil {
		w.keyring.AddTenant(name)
	}
}

// Sync pulls the shared quarantine flags and rotates the markers (every poll interval).
func (w *Watcher) Sync(ctx context.Context, now time.Time) {
	w.quarantine.Sync(ctx)
	if w.keyring != nil {
		w.keyring.Refresh(now)
	}
}

// Watch is one request's leak detection, from its marker to its reply's end.
type Watch struct {
	w         *Watcher
	rid       string
	engineRID string
	tenant    string
	kind      request.Kind
	req       *request.Request
	backends  []string // the path the request is forwarded along (nil until Forwarding)
	// echoes are foreign markers the client's own prompt contained (or began).
	echoes []string
	fp     printsState // prompt fingerprints (fingerprints.go)
	// text is the reply's prompt-text detector (nil: none), made with its guard.
	text *printsDetector
	// idsUnread: a token-id prompt whose text no engine on the route could give back; short
	// marker fragments in its reply may be the client's own, so they cut the reply but
	// quarantine nothing (a whole marker still does; see shortFragment).
	idsUnread bool
}

// Begin opens a request's watch. For a request of a generation route (req non-nil) it puts the
// tenant's current marker into the prompt (before render, so that it is counted) and remembers
// which foreign markers the client itself sent (echoes, not leaks). A utility route passes nil:
// its reply is scanned all the same.
func (w *Watcher) Begin(rid, engineRID string, t *tenants.Tenant, kind request.Kind, req *request.Request) *Watch {
	x := &Watch{w: w, rid: rid, engineRID: engineRID, tenant: t.Name, kind: kind, req: req}
	if w.keyring == nil || req == nil {
		return x
	}
	// Fragments count too: a reply repeating the 8 characters of a marker that the client sent
	// is the client's own text (FindMarkerFragments finds whole markers as well).
	x.fp.text = req.OwnText()
	x.echoes = w.keyring.FindMarkerFragments(x.fp.text)
	if !req.Kind.Generates() {
		return x // no text comes back to carry a marker; replies are still scanned
	}
	if t.CanaryOptOut {
		w.skipped.WithLabelValues("opt_out").Inc()
		return x
	}
	marker, _ := w.keyring.Current(t.Name, time.Now())
	if !req.Inject(marker, w.cfg.EveryBytes, w.cfg.Placement == config.PlacementPrefix) {
		w.skipped.WithLabelValues("input_ids").Inc()
		return x
	}
	w.injected.Inc()
	return x
}

// Forwarding is told the route the request goes along, before it is sent: the echo set is
// extended to its token-id prompts (read back by the route's engines; enc is the model's own
// vocabulary, a best effort) and the prompt is fingerprinted for other tenants' replies.
func (x *Watch) Forwarding(route *backends.Route, enc tokenize.Encoder) {
	if route != nil {
		x.backends = route.Backends
	}
	x.coverTokenIDs(route, enc)
	x.notePrompt()
}

// Guard is the reply's scanner (nil when canaries are off): its echoes and leaks are reported
// to this watch. One per reply read.
func (x *Watch) Guard() *reply.Guard {
	x.text = x.textDetector()
	return reply.NewGuard(reply.Scope{Keyring: x.w.keyring, Requester: x.tenant, Echoes: x.echoes, Kind: x.kind,
		EngineRID: x.engineRID, Watch: x})
}

// Reading opens a reading of the reply's text for the prompt-text detector (nil: none).
func (x *Watch) Reading() reply.TextReading {
	if x.text == nil {
		return nil
	}
	return x.text.Reading()
}

var _ reply.Watch = (*Watch)(nil)

// Done ends the watch once the reply is over: a weak prompt-text match is counted and logged.
func (x *Watch) Done() {
	if x != nil { // nil: the exchange ended before its watch began (refused at the door)
		x.printsDone()
	}
}
