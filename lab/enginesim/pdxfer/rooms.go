package pdxfer

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// RoomData is what prefill keeps for decode: the KV it computed (token ids,
// one for a stub) and the true prompt length, or an abort.
type RoomData struct {
	IDs       []uint32
	PromptLen int
	RID       string
	Aborted   bool
	Status    int // the abort's HTTP status
	Msg       string
}

// roomWire is the bootstrap port's JSON for GET /room/{room}.
type roomWire struct {
	RID       string   `json:"rid"`
	PromptLen int      `json:"prompt_len"`
	IDs       []uint32 `json:"ids"`
	Aborted   bool     `json:"aborted"`
	Status    int      `json:"status,omitempty"`
	Message   string   `json:"message,omitempty"`
}

type room struct {
	ready   chan struct{} // closed once data is set
	data    *RoomData
	release func() // frees prefill's pages; called once
	timer   *time.Timer
}

// Store holds prefill's rooms until decode pulls them (once) or they
// expire. Decode may ask before prefill has stored the room: the entry is
// created empty and the asker waits on ready.
type Store struct {
	mu    sync.Mutex
	m     map[uint64]*room
	byRID map[string]uint64
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{m: map[uint64]*room{}, byRID: map[string]uint64{}}
}

func (rs *Store) entry(id uint64) *room {
	r := rs.m[id]
	if r == nil {
		r = &room{ready: make(chan struct{})}
		rs.m[id] = r
	}
	return r
}

// Put stores a room's KV; release runs when it is pulled or expires.
func (rs *Store) Put(id uint64, d *RoomData, release func(), ttl time.Duration) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.entry(id)
	if r.data != nil {
		// A reused room id: the old KV is dropped.
		if r.release != nil {
			r.release()
		}
		if r.timer != nil {
			r.timer.Stop()
		}
		r = &room{ready: make(chan struct{})}
		rs.m[id] = r
	}
	r.data, r.release = d, release
	if d.RID != "" {
		rs.byRID[d.RID] = id
	}
	r.timer = time.AfterFunc(ttl, func() { rs.drop(id, r) })
	close(r.ready)
}

// Abort records an abort for the room; a waiting decode learns it at once.
func (rs *Store) Abort(id uint64, status int, msg string) {
	rs.Put(id, &RoomData{Aborted: true, Status: status, Msg: msg}, nil, time.Minute)
}

// AbortRID aborts the room of a request id, if prefill still holds it.
func (rs *Store) AbortRID(rid string) bool {
	rs.mu.Lock()
	id, ok := rs.byRID[rid]
	rs.mu.Unlock()
	if !ok {
		return false
	}
	rs.Abort(id, 400, "The request was aborted (abort_request for rid "+rid+").")
	return true
}

func (rs *Store) drop(id uint64, r *room) {
	rs.mu.Lock()
	if rs.m[id] != r {
		rs.mu.Unlock()
		return
	}
	delete(rs.m, id)
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.data != nil && r.data.RID != "" && rs.byRID[r.data.RID] == id {
		delete(rs.byRID, r.data.RID)
	}
	rel := r.release
	r.release = nil
	rs.mu.Unlock()
	if rel != nil {
		rel()
	}
}

// Take waits up to wait for the room and removes it (KV is pulled once).
func (rs *Store) Take(id uint64, wait time.Duration) *RoomData {
	rs.mu.Lock()
	r := rs.entry(id)
	rs.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-r.ready:
	case <-t.C:
		rs.mu.Lock()
		// Remove an entry nobody filled, so unknown rooms do not pile up.
		if rs.m[id] == r && r.data == nil {
			delete(rs.m, id)
		}
		rs.mu.Unlock()
		return nil
	}
	d := r.data
	rs.drop(id, r)
	return d
}

// Pending is the number of rooms held or awaited.
func (rs *Store) Pending() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.m)
}

// ---- the bootstrap port ----

// Handler serves GET /room/{room}?wait_ms=N on the bootstrap port: 200
// with the room (or its abort), 404 when nothing arrived in time. A request
// without wait_ms waits defaultWait.
func (rs *Store) Handler(defaultWait time.Duration) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) { rs.serveRoom(ctx, defaultWait) }
}

func (rs *Store) serveRoom(ctx *fasthttp.RequestCtx, defaultWait time.Duration) {
	path := string(ctx.Path())
	rest, ok := strings.CutPrefix(path, "/room/")
	if !ok || !ctx.IsGet() {
		ctx.SetStatusCode(404)
		return
	}
	id, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		ctx.SetStatusCode(400)
		ctx.SetBodyString(`{"error":"bad room"}`)
		return
	}
	wait := defaultWait
	if ms, err := strconv.Atoi(string(ctx.QueryArgs().Peek("wait_ms"))); err == nil && ms >= 0 {
		wait = time.Duration(ms) * time.Millisecond
	}
	d := rs.Take(id, wait)
	ctx.SetContentType("application/json")
	if d == nil {
		ctx.SetStatusCode(404)
		ctx.SetBodyString(`{"error":"room not ready"}`)
		return
	}
	b, _ := json.Marshal(roomWire{RID: d.RID, PromptLen: d.PromptLen, IDs: d.IDs, Aborted: d.Aborted, Status: d.Status, Message: d.Msg})
	ctx.SetBody(b)
}
