package state

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DomainPrints shares prompt fingerprints between replicas through one Redis stream per KV
// domain (an engine by default), each under a hash tag of its own, {kvp:<domain>}, so the
// streams spread over a cluster's masters and none sits on the control plane's {kvgate} slot.
//
// A stream entry is one prompt's fingerprints new to that domain (at most chunkFPs of them; a
// larger prompt takes several entries), and its id counts fingerprints: the id of an entry is
// the number of fingerprints written to the stream up to and including it ("N-0"). So the
// stream is trimmed to exactly the partition's budget (XTRIM MINID), a replica that starts
// bootstraps from the stream alone, and a reader knows what it missed: when the first entry
// still in the stream starts past the position it had read to, the difference was trimmed
// before it read it (a gap, counted). Each stream carries a random epoch, chosen when the stream
// is created: a stream that expired (no writes for the detect window) and was created again is
// told apart from one that moved on.
//
// Reads are sized by bytes (ReadBytes per domain per read) and at most one read per domain is in
// flight in a replica at a time (Pull skips a domain still being read); replies never read.
type DomainPrints struct {
	client redis.UniversalClient
	prefix string
	ttl    time.Duration
	// ReadBytes bounds one read of one stream (default 1 MiB).
	ReadBytes int
	// StaleAfter: a domain not read successfully for this long is stale (default 5 s).
	StaleAfter time.Duration
	// Clock dates the reads (time.Now; tests pin it).
	Clock func() time.Time

	mu      sync.Mutex
	follows map[string]*follow

	gaps, gapFPs, restarts, reads, readErrors, busy atomic.Uint64
}

// DomainRecord is one prompt's fingerprints in one domain's stream.
type DomainRecord struct {
	Origin string // the replica that published it
	Tenant string
	At     time.Time
	FPs    []uint64
}

// DomainBatch is what to publish to one domain: its partition's budget (fingerprints the
// stream keeps) and the records.
type DomainBatch struct {
	Domain  string
	Budget  int64
	Records []DomainRecord
}

// chunkFPs bounds the fingerprints of one stream entry (4 KiB), so a read's size in bytes
// follows from its entry count.
const chunkFPs = 512

// entryBytes is an entry's size at most, as a read counts it.
const entryBytes = chunkFPs*8 + 128

// follow is this replica's reading of one domain's stream.
type follow struct {
	busy     atomic.Bool // a read in flight
	started  bool        // read once
	epoch    string
	last     int64 // position read up to
	caughtUp bool  // the last read reached the end
	booted   bool  // caught up once
	gapUntil int64 // the stream still holds records written before a gap ended here
	lastOK   time.Time
}

// NewDomainPrints is the per-domain streams under prefix; ttl is the detect window (a stream
// not written for that long expires).
func NewDomainPrints(client redis.UniversalClient, prefix string, ttl time.Duration) *DomainPrints {
	return &DomainPrints{client: client, prefix: prefix, ttl: ttl, ReadBytes: 1 << 20, StaleAfter: 5 * time.Second, Clock: time.Now, follows: map[string]*follow{}}
}

// Key is domain's stream.
func (s *DomainPrints) Key(domain string) string { return Keys{s.prefix}.DomainPrints(domain) }

// publishScript appends entries to one domain's stream with ids counting fingerprints, trims it
// to the budget and renews its expiry. KEYS[1] the stream; ARGV: budget, ttl ms, an epoch for a
// new stream, then per entry tenant, origin, at (unix ms), fingerprints (8 bytes each). Returns
// the position after the last entry.
var publishScript = redis.NewScript(`
local key = KEYS[1]
local pos, epoch = 0, ARGV[3]
local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
if #last > 0 then
  pos = tonumber(string.match(last[1][1], '^(%d+)'))
  local f = last[1][2]
  for i = 1, #f, 2 do if f[i] == 'e' then epoch = f[i + 1] end end
end
for i = 4, #ARGV, 4 do
  local n = string.len(ARGV[i + 3]) / 8
  if n > 0 then
    pos = pos + n
    redis.call('XADD', key, string.format('%.0f-0', pos), 'e', epoch, 't', ARGV[i], 'o', ARGV[i + 1], 'a', ARGV[i + 2], 'f', ARGV[i + 3])
  end
end
local budget = tonumber(ARGV[1])
if pos > budget then
  redis.call('XTRIM', key, 'MINID', string.format('%.0f-0', pos - budget + 1))
end
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', key, ARGV[2]) end
return pos
`)

// Publish appends each batch's records to its domain's stream, in one pipelined round trip (on
// a cluster, one per master holding some of them). A batch Redis refused for want of the script
// (NOSCRIPT) is sent again with its text. The error names the first stream that failed; the
// others are written.
func (s *DomainPrints) Publish(ctx context.Context, batches []DomainBatch) error {
	type call struct {
		key  string
		args []any
		cmd  *redis.Cmd
	}
	calls := make([]call, 0, len(batches))
	for _, b := range batches {
		args := []any{b.Budget, s.ttl.Milliseconds(), strconv.FormatUint(rand.Uint64(), 36)}
		for _, rec := range b.Records {
			for k := 0; k < len(rec.FPs); k += chunkFPs {
				part := rec.FPs[k:min(k+chunkFPs, len(rec.FPs))]
				fps := make([]byte, 8*len(part))
				for i, f := range part {
					binary.LittleEndian.PutUint64(fps[8*i:], f)
				}
				args = append(args, rec.Tenant, rec.Origin, rec.At.UnixMilli(), fps)
			}
		}
		if len(args) > 3 {
			calls = append(calls, call{key: s.Key(b.Domain), args: args})
		}
	}
	keys := make([]string, len(calls))
	for i := range calls {
		keys[i] = calls[i].key
	}
	s.pipelined(ctx, keys, func(p redis.Pipeliner, i int) {
		calls[i].cmd = publishScript.EvalSha(ctx, p, []string{calls[i].key}, calls[i].args...)
	})
	var first error
	for _, c := range calls {
		err := c.cmd.Err()
		if isNoScript(err) {
			err = publishScript.Run(ctx, s.client, []string{c.key}, c.args...).Err()
		}
		if err != nil && first == nil {
			first = fmt.Errorf("publishing fingerprints to %s: %w", c.key, err)
		}
	}
	return first
}

// pipelined sends add's commands for keys in one pipeline per Redis master, the masters'
// concurrently: a master that does not answer fails its own keys' commands only (one cluster
// pipeline would fail them all once its deadline passed).
func (s *DomainPrints) pipelined(ctx context.Context, keys []string, add func(p redis.Pipeliner, i int)) {
	groups := map[string][]int{}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		for i, k := range keys {
			addr := ""
			if m, err := cc.MasterForKey(ctx, k); err == nil {
				addr = m.Options().Addr
			}
			groups[addr] = append(groups[addr], i)
		}
	} else if len(keys) > 0 {
		groups[""] = make([]int, len(keys))
		for i := range keys {
			groups[""][i] = i
		}
	}
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, i := range idx {
					add(p, i)
				}
				return nil
			})
		}()
	}
	wg.Wait()
}

// Pulled is what one Pull read from one domain's stream.
type Pulled struct {
	Domain  string
	Records int
	// Gap: fingerprints trimmed from the stream before this replica read them.
	Gap int64
	// Restarted: the stream was created again (it had expired); reading starts over.
	Restarted bool
	// More: the read was full; more records wait.
	More bool
	// Busy: a read of this domain was already in flight; nothing was read.
	Busy bool
	Err  error
}

// Pull reads, in one pipelined round trip, the next records of each domain's stream (at most
// ReadBytes each) and calls apply with each record in stream order, this replica's own
// included. A domain whose previous read is still in flight is skipped (Busy).
func (s *DomainPrints) Pull(ctx context.Context, domains []string, apply func(domain string, rec DomainRecord)) []Pulled {
	out := make([]Pulled, len(domains))
	type reading struct {
		f      *follow
		first  *redis.XMessageSliceCmd
		next   *redis.XMessageSliceCmd
		from   int64
		reread bool
	}
	rs := make([]reading, len(domains))
	count := int64(max(1, s.ReadBytes/entryBytes))
	s.mu.Lock()
	for i, d := range domains {
		out[i].Domain = d
		f := s.follows[d]
		if f == nil {
			f = &follow{}
			s.follows[d] = f
		}
		if !f.busy.CompareAndSwap(false, true) {
			out[i].Busy = true
			s.busy.Add(1)
			continue
		}
		rs[i].f = f
	}
	s.mu.Unlock()
	var keys []string
	var which []int
	for i, d := range domains {
		if rs[i].f != nil {
			keys, which = append(keys, s.Key(d)), append(which, i)
		}
	}
	s.pipelined(ctx, keys, func(p redis.Pipeliner, k int) {
		r := &rs[which[k]]
		r.from = r.f.last
		r.first = p.XRangeN(ctx, keys[k], "-", "+", 1)
		start := "-"
		if r.from > 0 {
			start = "(" + strconv.FormatInt(r.from, 10) + "-0"
		}
		r.next = p.XRangeN(ctx, keys[k], start, "+", count)
	})
	now := s.Clock()
	for i, d := range domains {
		r := &rs[i]
		if r.f == nil {
			continue
		}
		s.reads.Add(1)
		out[i] = s.take(r.f, d, r.first, r.next, count, now, apply)
		r.f.busy.Store(false)
	}
	return out
}

// take applies one domain's read. Called with f's read slot held.
func (s *DomainPrints) take(f *follow, domain string, first, next *redis.XMessageSliceCmd, count int64, now time.Time, apply func(string, DomainRecord)) Pulled {
	res := Pulled{Domain: domain}
	head, err := first.Result()
	if err == nil {
		err = next.Err()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		s.readErrors.Add(1)
		res.Err = fmt.Errorf("reading fingerprints from %s: %w", s.Key(domain), err)
		return res
	}
	f.lastOK = now
	defer func() { f.booted = f.booted || f.caughtUp }()
	if len(head) == 0 { // no stream: nothing written for the detect window, or ever
		if f.started && f.last > 0 {
			s.restarts.Add(1)
			res.Restarted = true
		}
		f.started, f.caughtUp, f.epoch, f.last, f.gapUntil = true, true, "", 0, 0
		return res
	}
	epoch, _ := head[0].Values["e"].(string)
	end, n := entryPos(head[0])
	start := end - n
	if f.epoch != "" && epoch != f.epoch { // created again: read it from the start next time
		s.restarts.Add(1)
		res.Restarted, res.More = true, true
		f.epoch, f.last, f.caughtUp = epoch, 0, false
		return res
	}
	if f.started && start > f.last {
		res.Gap = start - f.last
		s.gaps.Add(1)
		s.gapFPs.Add(uint64(res.Gap))
		f.gapUntil = start
	}
	if start > f.gapUntil && res.Gap == 0 {
		f.gapUntil = 0 // what the gap lost would have been trimmed by now: the partition is whole
	}
	f.started, f.epoch = true, epoch
	msgs := next.Val()
	for _, m := range msgs {
		pos, _ := entryPos(m)
		if pos <= f.last {
			continue
		}
		f.last = pos
		if rec, ok := decodeDomainRecord(m); ok {
			apply(domain, rec)
			res.Records++
		}
	}
	res.More = int64(len(msgs)) == count
	f.caughtUp = !res.More
	return res
}

// entryPos is an entry's position (its id's first part) and its fingerprint count.
func entryPos(m redis.XMessage) (int64, int64) {
	ms, _, _ := strings.Cut(m.ID, "-")
	pos, _ := strconv.ParseInt(ms, 10, 64)
	f, _ := m.Values["f"].(string)
	return pos, int64(len(f) / 8)
}

func decodeDomainRecord(m redis.XMessage) (DomainRecord, bool) {
	o, t, fps, ok := fields(m)
	if !ok {
		return DomainRecord{}, false
	}
	rec := DomainRecord{Origin: o, Tenant: t, FPs: fps}
	if a, _ := m.Values["a"].(string); a != "" {
		if ms, err := strconv.ParseInt(a, 10, 64); err == nil {
			rec.At = time.UnixMilli(ms)
		}
	}
	return rec, true
}

// DomainState is this replica's reading of one domain's stream: why its partition may lack
// other replicas' text.
type DomainState struct {
	Bootstrapping bool // never read to the end
	Gapped        bool // records were trimmed before they were read, and may still matter
	Stale         bool // not read successfully for StaleAfter
}

// State is domain's reading at now.
func (s *DomainPrints) State(domain string, now time.Time) DomainState {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.follows[domain]
	if f == nil {
		return DomainState{Bootstrapping: true}
	}
	return DomainState{Bootstrapping: !f.booted, Gapped: f.gapUntil > 0, Stale: !f.lastOK.IsZero() && now.Sub(f.lastOK) > s.StaleAfter}
}

// StreamStats are the counters of this replica's reading, for export
// (kvgate_fingerprint_stream_gaps_total, …_gap_fingerprints_total, …_restarts_total,
// …_reads_total, …_read_errors_total, …_reads_skipped_busy_total).
type StreamStats struct {
	Gaps, GapFingerprints, Restarts, Reads, ReadErrors, SkippedBusy uint64
}

// Stats reads the counters.
func (s *DomainPrints) Stats() StreamStats {
	return StreamStats{Gaps: s.gaps.Load(), GapFingerprints: s.gapFPs.Load(), Restarts: s.restarts.Load(),
		Reads: s.reads.Load(), ReadErrors: s.readErrors.Load(), SkippedBusy: s.busy.Load()}
}
