package state

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// PrintsRecord is one forwarded prompt's fingerprints as replicas share them: keyed hashes (a
// PRF of the canary secret), the tenant and its backends; never text.
type PrintsRecord struct {
	Origin   string // the replica that forwarded the prompt
	Tenant   string
	Backends []string
	At       time.Time
	FPs      []uint64
	// Seq numbers the records of one replica's queue (not shared: the publisher's bookkeeping).
	Seq uint64
}

// RedisPrints shares prompt fingerprint records through a Redis stream, so that a reply served
// by one replica is checked against the prompts every replica forwarded. The stream is capped
// (MAXLEN ~ maxLen entries), trimmed to ttl on every write and expires ttl after the last.
type RedisPrints struct {
	client redis.UniversalClient
	key    string
	ttl    time.Duration
	maxLen int64
}

// NewRedisPrints is the shared stream under prefix; maxLen ≤ 0 means 4096 records.
func NewRedisPrints(client redis.UniversalClient, prefix string, ttl time.Duration, maxLen int) *RedisPrints {
	if maxLen <= 0 {
		maxLen = 4096
	}
	return &RedisPrints{client: client, key: Keys{prefix}.Prints(), ttl: ttl, maxLen: int64(maxLen)}
}

// Key is the stream's key.
func (r *RedisPrints) Key() string { return r.key }

// Publish appends rec to the stream.
func (r *RedisPrints) Publish(ctx context.Context, rec PrintsRecord) error {
	return r.PublishBatch(ctx, []PrintsRecord{rec}, "", nil)
}

// readBatch is how many records one XRANGE returns.
const readBatch = 1024

// PublishBatch appends every record to the stream in one pipelined round trip, trims it once,
// and, with apply, reads back in the same round trip every record after the id from: the
// records of every replica written before these, and these. So when it returns, the caller has
// applied the stream up to its own last record (more reads follow only when over readBatch
// records were waiting). Records keep their order.
func (r *RedisPrints) PublishBatch(ctx context.Context, recs []PrintsRecord, from string, apply func(id string, rec PrintsRecord, ok bool)) error {
	if len(recs) == 0 {
		return nil
	}
	if from == "" {
		from = "0-0"
	}
	var read *redis.XMessageSliceCmd
	_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, rec := range recs {
			fps := make([]byte, 8*len(rec.FPs))
			for i, f := range rec.FPs {
				binary.LittleEndian.PutUint64(fps[8*i:], f)
			}
			p.XAdd(ctx, &redis.XAddArgs{Stream: r.key, MaxLen: r.maxLen, Approx: true,
				Values: []any{"o", rec.Origin, "t", rec.Tenant, "b", strings.Join(rec.Backends, "\n"), "f", fps}})
		}
		if r.ttl > 0 {
			p.XTrimMinID(ctx, r.key, strconv.FormatInt(time.Now().Add(-r.ttl).UnixMilli(), 10))
			p.PExpire(ctx, r.key, r.ttl)
		}
		if apply != nil {
			read = p.XRangeN(ctx, r.key, "("+from, "+", readBatch)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sharing %d prompt fingerprint records in %s: %w", len(recs), r.key, err)
	}
	if apply == nil {
		return nil
	}
	msgs := read.Val()
	for _, m := range msgs {
		rec, ok := decodePrints(m)
		apply(m.ID, rec, ok)
	}
	if len(msgs) == readBatch {
		return r.CatchUp(ctx, msgs[len(msgs)-1].ID, apply)
	}
	return nil
}

// CatchUp calls apply with every record after the id from, without waiting: a reply about to be
// scanned sees every prompt published before it.
func (r *RedisPrints) CatchUp(ctx context.Context, from string, apply func(id string, rec PrintsRecord, ok bool)) error {
	if from == "" {
		from = "0-0"
	}
	for {
		msgs, err := r.client.XRangeN(ctx, r.key, "("+from, "+", readBatch).Result()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			from = m.ID
			rec, ok := decodePrints(m)
			apply(m.ID, rec, ok)
		}
		if len(msgs) < readBatch {
			return nil
		}
	}
}

// IDLess orders two stream ids ("ms-seq"; "" before every id).
func IDLess(a, b string) bool {
	if a == "" || b == "" {
		return a == "" && b != ""
	}
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	an, _ := strconv.ParseUint(am, 10, 64)
	bn, _ := strconv.ParseUint(bm, 10, 64)
	if an != bn {
		return an < bn
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return asq < bsq
}

// fields reads a fingerprint entry's origin, tenant and fingerprints (ok: a tenant and whole
// fingerprints).
func fields(m redis.XMessage) (origin, tenant string, fps []uint64, ok bool) {
	origin, _ = m.Values["o"].(string)
	tenant, _ = m.Values["t"].(string)
	f, _ := m.Values["f"].(string)
	if tenant == "" || len(f)%8 != 0 {
		return "", "", nil, false
	}
	fps = make([]uint64, len(f)/8)
	for i := range fps {
		fps[i] = binary.LittleEndian.Uint64([]byte(f[8*i : 8*i+8]))
	}
	return origin, tenant, fps, true
}

func decodePrints(m redis.XMessage) (PrintsRecord, bool) {
	o, t, fps, ok := fields(m)
	if !ok {
		return PrintsRecord{}, false
	}
	rec := PrintsRecord{Origin: o, Tenant: t, FPs: fps}
	if b, _ := m.Values["b"].(string); b != "" {
		rec.Backends = strings.Split(b, "\n")
	}
	if ms, _, ok := strings.Cut(m.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			rec.At = time.UnixMilli(n)
		}
	}
	return rec, true
}
