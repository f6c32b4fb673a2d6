package enginesim

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// roomData is what prefill keeps for decode: the KV it computed (token ids,
// one for a stub) and the true prompt length, or an abort.
type roomData struct {
	ids       []uint32
	promptLen int
	rid       string
	aborted   bool
	status    int
	msg       string
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
	data    *roomData
	release func() // frees prefill's pages; called once
	timer   *time.Timer
}

// roomStore holds prefill's rooms until decode pulls them (once) or they
// expire. Decode may ask before prefill has stored the room: the entry is
// created empty and the asker waits on ready.
type roomStore struct {
	mu    sync.Mutex
	m     map[uint64]*room
	byRID map[string]uint64
}

func newRoomStore() *roomStore {
	return &roomStore{m: map[uint64]*room{}, byRID: map[string]uint64{}}
}

func (rs *roomStore) entry(id uint64) *room {
	r := rs.m[id]
	if r == nil {
		r = &room{ready: make(chan struct{})}
		rs.m[id] = r
	}
	return r
}

// put stores a room's KV; release runs when it is pulled or expires.
func (rs *roomStore) put(id uint64, d *roomData, release func(), ttl time.Duration) {
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
	if d.rid != "" {
		rs.byRID[d.rid] = id
	}
	r.timer = time.AfterFunc(ttl, func() { rs.drop(id, r) })
	close(r.ready)
}

// abort records an abort for the room; a waiting decode learns it at once.
func (rs *roomStore) abort(id uint64, status int, msg string) {
	rs.put(id, &roomData{aborted: true, status: status, msg: msg}, nil, time.Minute)
}

// abortRID aborts the room of a request id, if prefill still holds it.
func (rs *roomStore) abortRID(rid string) bool {
	rs.mu.Lock()
	id, ok := rs.byRID[rid]
	rs.mu.Unlock()
	if !ok {
		return false
	}
	rs.abort(id, 400, "The request was aborted (abort_request for rid "+rid+").")
	return true
}

func (rs *roomStore) drop(id uint64, r *room) {
	rs.mu.Lock()
	if rs.m[id] != r {
		rs.mu.Unlock()
		return
	}
	delete(rs.m, id)
	if r.timer != nil {
		r.timer.Stop()
	}
	if r.data != nil && r.data.rid != "" && rs.byRID[r.data.rid] == id {
		delete(rs.byRID, r.data.rid)
	}
	rel := r.release
	r.release = nil
	rs.mu.Unlock()
	if rel != nil {
		rel()
	}
}

// take waits up to wait for the room and removes it (KV is pulled once).
func (rs *roomStore) take(id uint64, wait time.Duration) *roomData {
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

func (rs *roomStore) pending() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.m)
}

// bootstrapHandler serves GET /room/{room}?wait_ms=N on the bootstrap port:
// 200 with the room (or its abort), 404 when nothing arrived in time.
func (s *Server) bootstrapHandler(ctx *fasthttp.RequestCtx) {
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
	wait := s.cfg.TransferTimeout
	if ms, err := strconv.Atoi(string(ctx.QueryArgs().Peek("wait_ms"))); err == nil && ms >= 0 {
		wait = time.Duration(ms) * time.Millisecond
	}
	d := s.rooms.take(id, wait)
	ctx.SetContentType("application/json")
	if d == nil {
		ctx.SetStatusCode(404)
		ctx.SetBodyString(`{"error":"room not ready"}`)
		return
	}
	b, _ := json.Marshal(roomWire{RID: d.rid, PromptLen: d.promptLen, IDs: d.ids, Aborted: d.aborted, Status: d.status, Message: d.msg})
	ctx.SetBody(b)
}
