package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/request"
)

// The upstream body carries our rid and, for PD, bootstrap fields pointing at the prefill, with a
// room that is new on every call and distinct per batch item.
func TestUpstreamBodyBootstrapFields(t *testing.T) {
	set, err := backends.New([]config.Backend{{Name: "p", URL: "http://127.0.0.1:1", Role: "prefill"}, {Name: "d", URL: "http://127.0.0.1:2", Role: "decode"}},
		backends.Options{PollInterval: time.Second, MaxAge: time.Second, PollTimeout: time.Second}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	prefill := set.Get("p")
	backends.SetCapacityForTest(prefill, &backends.Capacity{BootstrapPort: 8998})
	for _, c := range []struct {
		kind  request.Kind
		body  string
		batch int
	}{
		{request.Generate, `{"text":"hello"}`, 0},
		{request.Generate, `{"text":["a","b","c"]}`, 3},
		{request.Chat, `{"messages":[{"role":"user","content":"hi"}]}`, 0},
	} {
		req, e := request.Parse(c.kind, []byte(c.body))
		if e != nil {
			t.Fatal(e)
		}
		req.Render()
		x := &exchange{req: req, kind: c.kind, rid: "r1"}
		seen := map[uint64]bool{}
		for i := 0; i < 50; i++ {
			var f map[string]json.RawMessage
			if err := json.Unmarshal(x.body(x.ridsFor("r1"), prefill), &f); err != nil {
				t.Fatal(err)
			}
			if c.batch == 0 {
				var host string
				var port int
				var room uint64
				if json.Unmarshal(f["bootstrap_host"], &host) != nil || json.Unmarshal(f["bootstrap_port"], &port) != nil ||
					json.Unmarshal(f["bootstrap_room"], &room) != nil || host != "127.0.0.1" || port != 8998 || room >= 1<<63 {
					t.Fatalf("bootstrap fields wrong: %s", f["bootstrap_host"])
				}
				if seen[room] {
					t.Fatalf("room %d reused", room)
				}
				seen[room] = true
				var rid string
				if json.Unmarshal(f["rid"], &rid) != nil || rid != "r1" {
					t.Fatalf("rid: %s", f["rid"])
				}
				continue
			}
			var hosts []string
			var ports []int
			var rooms []uint64
			var rids []string
			if json.Unmarshal(f["bootstrap_host"], &hosts) != nil || json.Unmarshal(f["bootstrap_port"], &ports) != nil ||
				json.Unmarshal(f["bootstrap_room"], &rooms) != nil || json.Unmarshal(f["rid"], &rids) != nil ||
				len(hosts) != c.batch || len(ports) != c.batch || len(rooms) != c.batch || len(rids) != c.batch {
				t.Fatalf("batch bootstrap fields must be arrays of %d: %s %s %s", c.batch, f["bootstrap_host"], f["bootstrap_room"], f["rid"])
			}
			for _, r := range rooms {
				if seen[r] {
					t.Fatalf("room %d reused within or across batches", r)
				}
				seen[r] = true
			}
		}
		// Unified: no bootstrap fields at all.
		var f map[string]json.RawMessage
		_ = json.Unmarshal(x.body(x.ridsFor("r1"), nil), &f)
		if _, ok := f["bootstrap_room"]; ok {
			t.Fatal("unified requests must not carry bootstrap fields")
		}
	}
}

// body and ridsFor are the engine layer's body as this exchange's request gets it.
func (x *exchange) body(rids []string, prefill *backends.Backend) []byte {
	return backends.EngineBody(x.req.Fields, rids, x.req.Batch, prefill)
}

func (x *exchange) ridsFor(base string) []string {
	return backends.Rids(base, x.req.Batch, len(x.req.Prompts))
}
