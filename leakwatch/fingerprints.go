package leakwatch

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/fingerprint"
	"github.com/kvgate/kvgate/internal/panics"
	"github.com/kvgate/kvgate/reply"
	"github.com/kvgate/kvgate/state"
)

// The second leak detector: another tenant's prompt text in a reply (package fingerprint), beside
// the markers. Prompts are fingerprinted when they are forwarded; each reply's text is checked as
// it streams; a strong match takes the marker's path (cut, incident, quarantine). The index is
// shared with the other replicas through the state store's stream.

// printsState is a Watch's part: its prompt's text and filter, and its reply's scanner.
type printsState struct {
	text    string // the client's own prompt text (request.OwnText), saved by inject
	idsText string // text of token-id prompts as an engine detokenized it (coverTokenIDs)
	own     *fingerprint.Own
	scanner *fingerprint.Scanner // the first reading's (the joined text); the others fork it
	// readings are every reading of the reply's text the guard opened (the joined one first,
	// then one per field, choice and item), hitBy the one that reported the match
	readings []*fingerprint.Scanner
	hit      *canary.Hit // the match a reading reported, if one did
	hitBy    *fingerprint.Scanner
	flagged  bool   // the match was recorded, the reply passed on (canary.fingerprints.mode monitor)
	seq      uint64 // this prompt's number in the shared stream's queue (0: not queued)
}

// initPrints builds this replica's fingerprint index (nil: canaries or fingerprints off) and its
// metrics.
func (g *Watcher) initPrints(reg *prometheus.Registry) {
	c := g.cfg
	if !c.Enabled || c.Fingerprints.Off {
		return
	}
	g.prints = fingerprint.NewIndex(fingerprint.NewHasher([]byte(c.Secret)), fingerprint.Config{
		MaxBytes: c.Fingerprints.MaxBytes, TTL: c.DetectWindow,
		CutMatches: c.Fingerprints.CutMatches, CommonTenants: c.Fingerprints.CommonTenants})
	if !c.Fingerprints.ReplicaLocal && g.state.Prints != nil {
		g.printsOut = make(chan state.PrintsRecord, printsQueue)
		g.printsTick = make(chan struct{})
	}
	g.printsUnshared = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_fingerprint_unshared_total",
		Help: "Prompt fingerprint records kept on this replica only (the shared stream's queue was full or Redis failed)."})
	g.printsWeak = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_fingerprint_weak_total",
		Help: "Replies that carried some of another tenant's recent prompt fingerprints, fewer than canary.fingerprints.cut_matches (counted and logged, no incident)."})
	stat := func(name, help string, f func(fingerprint.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(g.prints.Stats()) })
	}
	g.printsWaitLate = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvgate_fingerprint_catchup_reads_total",
		Help: "Replies whose own prompt record was not published in time (or could not be queued), so that they read the shared fingerprint stream from Redis first (one round trip)."})
	reg.MustRegister(g.printsWeak, g.printsUnshared, g.printsWaitLate,
		stat("kvgate_fingerprint_index_bytes", "Bytes accounted to this replica's prompt fingerprint index (capped by canary.fingerprints.max_bytes).",
			func(s fingerprint.Stats) float64 { return float64(s.Bytes) }),
		stat("kvgate_fingerprint_index_prompts", "Prompts whose fingerprints this replica keeps.",
			func(s fingerprint.Stats) float64 { return float64(s.Prompts) }),
		stat("kvgate_fingerprint_index_evicted", "Prompts forgotten (oldest first, at the cap or past canary.detect_window).",
			func(s fingerprint.Stats) float64 { return float64(s.Evicted) }))
}

// printsQueue bounds the records waiting for the shared stream: beyond it a record stays
// replica-local (counted), never delaying a request. printsBatch records go in one round trip.
const (
	printsQueue = 4096
	printsBatch = 256
)

// Run shares this replica's prompt fingerprints and applies every other replica's, until
// ctx ends (nothing when replica-local). One publisher does both: each batch it writes reads back,
// in the same round trip, whatever every replica wrote since its last read.
func (g *Watcher) Run(ctx context.Context) {
	if g.printsOut == nil {
		return
	}
	go panics.Loop(ctx, g.log, "prints_publish", time.Second, func(ctx context.Context) {
		batch := make([]state.PrintsRecord, 0, printsBatch)
		for {
			select {
			case <-ctx.Done():
				return
			case rec := <-g.printsOut:
				batch = append(batch[:0], rec)
			}
			// Group commit: whatever queued while the last batch was in flight goes now, in one
			// pipelined round trip; an idle replica sends a record the moment it is queued.
			batch = g.takePrints(batch)
			g.publishPrints(ctx, batch, 2*time.Second)
			clear(batch) // the records' slices are not kept alive by the buffer
		}
	})
}

// takePrints appends to batch the records queued now, up to printsBatch, without waiting.
func (g *Watcher) takePrints(batch []state.PrintsRecord) []state.PrintsRecord {
	for len(batch) < printsBatch {
		select {
		case rec := <-g.printsOut:
			batch = append(batch, rec)
		default:
			return batch
		}
	}
	return batch
}

// Flush publishes what is still queued (at shutdown).
func (g *Watcher) Flush(ctx context.Context) {
	if g.printsOut == nil {
		return
	}
	for {
		batch := g.takePrints(nil)
		if len(batch) == 0 || ctx.Err() != nil {
			return
		}
		g.publishPrints(ctx, batch, time.Second)
	}
}

// publishPrints writes the records to the shared stream within timeout; a failure leaves them
// local. Either way the records are settled: replies waiting for them (awaitPrints) go on.
func (g *Watcher) publishPrints(ctx context.Context, recs []state.PrintsRecord, timeout time.Duration) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	g.printsMu.Lock()
	from := g.printsLast
	g.printsMu.Unlock()
	err := g.state.Prints.PublishBatch(pctx, recs, from, g.applyPrints)
	g.printsDown.Store(err != nil)
	if err != nil {
		g.printsUnshared.Add(float64(len(recs)))
		g.log.Warn("prompt fingerprints not shared (kept on this replica)", zap.Int("records", len(recs)), zap.Error(err))
	}
	g.printsMu.Lock()
	g.printsSettled = max(g.printsSettled, recs[len(recs)-1].Seq)
	close(g.printsTick) // wakes every reply waiting in awaitPrints
	g.printsTick = make(chan struct{})
	g.printsMu.Unlock()
}

// applyPrints records another replica's prompt once, in stream order (the publisher's read-back
// and readPrints both read the stream).
func (g *Watcher) applyPrints(id string, rec state.PrintsRecord, ok bool) {
	g.printsMu.Lock()
	defer g.printsMu.Unlock()
	if !state.IDLess(g.printsLast, id) {
		return
	}
	g.printsLast = id
	if ok && rec.Origin != g.replicaID {
		g.prints.Record(rec.Tenant, rec.Backends, rec.FPs, rec.At)
	}
}

// readPrints reads the shared stream from the last record applied, now (one round trip; a
// failure leaves the next publish to catch up).
func (g *Watcher) readPrints() {
	g.printsMu.Lock()
	from := g.printsLast
	g.printsMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = g.state.Prints.CatchUp(ctx, from, g.applyPrints)
}

// notePrompt fingerprints the prompt about to be forwarded along x.route: the index keeps a
// sample for other tenants' replies, and the filter of all of it serves this reply.
func (x *Watch) notePrompt() {
	text := x.fp.text
	if x.fp.idsText != "" {
		text += "\n" + x.fp.idsText
	}
	x.fp.text, x.fp.idsText = "", "" // the filter is all this request needs from here
	ix := x.w.prints
	if ix == nil || x.backends == nil {
		return
	}
	fps, own := ix.Hasher().Prompt(text)
	x.fp.own = own
	now := time.Now()
	if x.w.printsOut != nil {
		// Queued (bounded), never waited for here: the publisher sends it at once when idle, or
		// with the records queued meanwhile in one pipelined round trip that also reads the
		// stream back; the reply waits for that publish (awaitPrints), not the request.
		rec := state.PrintsRecord{Origin: x.w.replicaID, Tenant: x.tenant, Backends: x.backends, At: now, FPs: slices.Clone(fps)}
		g := x.w
		// Numbered under a lock held across the send, so records enter the queue in number
		// order and a published record settles every lower number.
		g.printsQueueMu.Lock()
		rec.Seq = g.printsQueued + 1
		select {
		case g.printsOut <- rec:
			g.printsQueued, x.fp.seq = rec.Seq, rec.Seq
		default:
			g.printsUnshared.Inc()
		}
		g.printsQueueMu.Unlock()
	}
	ix.Record(x.tenant, x.backends, fps, now)
}

// textDetector is the reply's fingerprint scanner for the guard (nil: none). A token-id prompt
// whose text no engine gave back gets none: its own text cannot be told from another's.
func (x *Watch) textDetector() *printsDetector {
	if x.w.prints == nil || x.backends == nil || x.idsUnread || !x.kind.Generates() {
		return nil
	}
	if x.fp.scanner == nil {
		x.awaitPrints()
		x.fp.scanner = x.w.prints.NewScanner(x.tenant, x.backends, x.fp.own)
	}
	return &printsDetector{x}
}

// printsWait bounds how long a reply waits for its own prompt record's publish.
const printsWait = 200 * time.Millisecond

// awaitPrints makes sure the reply is checked against every prompt that any replica published
// before this exchange's own prompt record: the publish of that record read the stream back up
// to it. The record was queued before the prompt was forwarded, so the publish overlaps the
// engine's work (and is shared with the records queued meanwhile); a publish that is late (Redis
// slow) gets printsWait, then the reply reads the stream itself, as does a reply whose prompt
// could not be queued (queue full).
func (x *Watch) awaitPrints() {
	g := x.w
	if g.printsOut == nil || g.printsDown.Load() {
		return // Redis is away: replies are checked against what this replica has (G5)
	}
	if x.fp.seq == 0 {
		g.printsWaitLate.Inc()
		g.readPrints()
		return
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		g.printsMu.Lock()
		done, tick := g.printsSettled >= x.fp.seq, g.printsTick
		g.printsMu.Unlock()
		if done {
			return
		}
		if timer == nil {
			timer = time.NewTimer(printsWait)
		}
		select {
		case <-tick:
		case <-timer.C:
			g.printsWaitLate.Inc()
			g.readPrints()
			return
		}
	}
}

type printsDetector struct{ x *Watch }

// Reading opens one reading of the reply's text: the first is the scanner made for the reply,
// every later one a fork of it (same requester, path and own prompt).
func (d printsDetector) Reading() reply.TextReading {
	fp := &d.x.fp
	sc := fp.scanner
	if len(fp.readings) > 0 {
		sc = sc.Fork()
	}
	fp.readings = append(fp.readings, sc)
	return printsReading{d.x, sc}
}

type printsReading struct {
	x  *Watch
	sc *fingerprint.Scanner
}

// Fork is a copy of the reading as it stands (the joined reading leaving a field's).
func (r printsReading) Fork() reply.TextReading {
	sc := r.sc.Clone()
	r.x.fp.readings = append(r.x.fp.readings, sc)
	return printsReading{r.x, sc}
}

// Feed reports the first match of any reading (enforce: the reply is cut there). In monitor
// mode the match is recorded as a flagged incident and the reply goes on.
func (r printsReading) Feed(text string) *canary.Hit {
	fp := &r.x.fp
	if fp.hit != nil {
		if fp.flagged {
			return nil
		}
		return fp.hit
	}
	if !r.sc.Feed(text) {
		return nil
	}
	fp.hit, fp.hitBy = &canary.Hit{Victim: r.sc.Victim()}, r.sc
	if r.x.w.cfg.Fingerprints.Mode == config.ModeMonitor {
		fp.flagged = true
		r.x.Leak(*fp.hit)
		return nil
	}
	return fp.hit
}

// printsEvidence fills a leak incident that the fingerprint scanner reported; false when h is
// not its hit.
func (x *Watch) printsEvidence(inc *state.Incident, h canary.Hit) bool {
	if x.fp.hit == nil || *x.fp.hit != h {
		return false
	}
	sc := x.fp.hitBy
	inc.Detector, inc.Evidence, inc.Flagged = state.DetectorFingerprint, state.EvidenceText, x.fp.flagged
	inc.Matches, inc.Victims = sc.Count(), sc.Victims()
	for _, m := range sc.Matches() {
		inc.Fingerprints = append(inc.Fingerprints, state.FingerprintMatch{Fingerprint: m.Fingerprint, End: m.End, Length: m.Length, Victim: m.Victim})
	}
	return true
}

// printsDone counts a reply that carried fewer foreign fingerprints than a cut needs: a weak
// match (one shared phrase is not a leak), logged without text.
func (x *Watch) printsDone() {
	if x.fp.hit != nil {
		return
	}
	var sc *fingerprint.Scanner
	for _, r := range x.fp.readings {
		if r.Count() > 0 && (sc == nil || r.Count() > sc.Count()) {
			sc = r
		}
	}
	if sc == nil {
		return
	}
	x.w.printsWeak.Inc()
	x.w.log.Info("reply carried a few fingerprints of another tenant's recent prompt (below the cut)",
		zap.String("request_id", x.rid), zap.String("requester", x.tenant), zap.String("victim", sc.Victim()),
		zap.Int("matches", sc.Count()), zap.Int("cut_matches", x.w.prints.Config().CutMatches))
}
