package gateway

// The admission queue (queue.enabled, issue 34): after the 413 decision and the tenant limits,
// a request waits until its route's free KV holds it; package fairqueue decides who goes next.

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/fairqueue"
)

// queues are the admission queues, one per served model ("" is the one-model gateway's).
type queues struct {
	mu     sync.Mutex
	byName map[string]*fairqueue.Queue
	conf   config.Queue
	length *prometheus.GaugeVec
	wait   *prometheus.HistogramVec
}

func newQueues(conf config.Queue, reg *prometheus.Registry) *queues {
	q := &queues{byName: map[string]*fairqueue.Queue{}, conf: conf}
	q.length = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvgate_queue_length",
		Help: "Requests waiting in the admission queue for free KV, by model and tenant."}, []string{"model", "tenant"})
	q.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvgate_queue_wait_seconds",
		Help:    "Time requests waited in the admission queue (dispatched, timed out or left), by model and tenant.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"model", "tenant"})
	reg.MustRegister(q.length, q.wait)
	return q
}

func (q *queues) of(model string) *fairqueue.Queue {
	q.mu.Lock()
	defer q.mu.Unlock()
	fq := q.byName[model]
	if fq == nil {
		p := fairqueue.Fair
		if q.conf.Policy == config.QueueRoundRobin {
			p = fairqueue.RoundRobin
		}
		fq = fairqueue.New(p, q.conf.MaxQueued)
		q.byName[model] = fq
	}
	return fq
}

// kick dispatches what now fits on every queue: the poller read a backend's usage afresh.
func (q *queues) kick() {
	q.mu.Lock()
	all := make([]*fairqueue.Queue, 0, len(q.byName))
	for _, fq := range q.byName {
		all = append(all, fq)
	}
	q.mu.Unlock()
	for _, fq := range all {
		fq.Dispatch(reserveRoute)
	}
}

// queued is an exchange's place in the queue, from Submit to close.
type queued struct {
	q      *fairqueue.Queue
	ticket *fairqueue.Ticket
	prompt int
	output int
	route  *backends.Route
}

// reserveRoute is fairqueue's fits: the route's free KV holds the request, and is taken.
func reserveRoute(t *fairqueue.Ticket) bool {
	w := t.Value.(*queued)
	return w.route.Reserve(w.prompt, w.output)
}

// enqueue holds the request until its route's free KV takes it. Nothing is written to the
// client meanwhile (a stream's headers go out at dispatch). Full: 503 at once; timeout: 429
// with Retry-After; a client that leaves is dropped at once, charged nothing.
func (x *exchange) enqueue(ctx *fasthttp.RequestCtx) *apierr.Error {
	qs := x.g.queues
	if qs == nil {
		return nil
	}
	weight := x.tenant.Weight
	// The ticket is the admission Need, as the limits reserve it: the queue reads nothing the
	// limits wrote, so either may go first.
	w := &queued{q: qs.of(x.servedModel), prompt: int(x.need.Prompt), output: int(x.need.Output), route: x.route}
	w.ticket = &fairqueue.Ticket{Tenant: x.tenant.Name, Tokens: x.need.Tokens(), Weight: weight, Value: w}
	model := x.servedModel
	if model == "" {
		model = x.g.metrics.models.label(routeModel(x.route))
	}
	start := time.Now()
	if err := w.q.Submit(w.ticket, reserveRoute); err != nil {
		return &apierr.Error{Status: 503, Type: "server_error", Code: "queue_full", RetryAfter: 2, Reason: "queue_full",
			Message: "The admission queue for this model is full (queue.max_queued); retry later."}
	}
	if !w.ticket.Dispatched() {
		gauge := qs.length.WithLabelValues(model, x.tenant.Name)
		gauge.Inc()
		timer := time.NewTimer(qs.conf.Timeout)
		gone, stop := watchClient(ctx)
		err := w.q.Wait(w.ticket, timer.C, gone)
		stop()
		timer.Stop()
		gauge.Dec()
		waited := time.Since(start)
		qs.wait.WithLabelValues(model, x.tenant.Name).Observe(waited.Seconds())
		switch {
		case errors.Is(err, fairqueue.ErrTimeout):
			return &apierr.Error{Status: 429, Type: "rate_limit_error", Code: "queue_timeout", Reason: "queue_timeout",
				RetryAfter: max(1, int(qs.conf.Timeout/time.Second)/2),
				Message:    "The model's free KV did not hold this request within queue.timeout; retry later."}
		case errors.Is(err, fairqueue.ErrGone):
			ctx.SetConnectionClose()
			return &apierr.Error{Status: 499, Type: "invalid_request_error", Code: "client_gone", Reason: "client_gone", Message: "The client left while queued."}
		}
		var nb [20]byte
		ctx.Response.Header.SetBytesV("X-Kvgate-Queue-Ms", strconv.AppendInt(nb[:0], waited.Milliseconds(), 10))
	}
	x.queued = w
	return nil
}

// releaseQueue frees the request's KV reservation, corrects its tenant's charge to what the
// reply used (settled before it, in end), and lets the next waiting requests go.
func (x *exchange) releaseQueue() {
	w := x.queued
	if w == nil {
		return
	}
	x.queued = nil
	w.route.Unreserve(w.prompt, w.output)
	if x.usage != "" {
		w.q.Settle(w.ticket, x.promptTokens+x.outputTokens)
	}
	w.q.Dispatch(reserveRoute)
}

// watchClient reports on gone when the client closes its connection while its request waits.
// stop ends the watch before the reply is written. A byte read meanwhile (a pipelined next
// request) cannot be put back, so the connection then closes after this reply.
func watchClient(ctx *fasthttp.RequestCtx) (gone <-chan struct{}, stop func()) {
	c := ctx.Conn()
	ch, done := make(chan struct{}), make(chan struct{})
	if c == nil {
		return ch, func() {}
	}
	var readData bool
	go func() {
		defer close(done)
		var b [1]byte
		n, err := c.Read(b[:])
		if n > 0 {
			readData = true
			return
		}
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) {
			close(ch)
		}
	}()
	return ch, func() {
		_ = c.SetReadDeadline(time.Unix(1, 0)) // a deadline in the past ends the read at once
		<-done
		_ = c.SetReadDeadline(time.Time{}) // fasthttp sets its own before the next request
		if readData {
			ctx.SetConnectionClose()
		}
	}
}
