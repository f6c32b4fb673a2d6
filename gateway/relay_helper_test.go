package gateway

import (
	"github.com/kvgate/kvgate/canary"
	"github.com/kvgate/kvgate/reply"
)

// testStream drives the stream relay (parse, decode, scan, re-serialise) one raw chunk at a time,
// as relayReader does, without a network.
type testStream struct {
	e    *reply.Stream
	leak *canary.Hit
}

func streamOf(x *exchange) *testStream { return &testStream{e: x.newEventRelay(x.watch.Guard(), nil)} }

// event writes raw upstream bytes and returns what the client gets for them, and false once the
// stream was ended (a leak or a refused event).
func (s *testStream) event(raw []byte) ([]byte, bool) {
	s.e.Write(raw)
	return s.take()
}

// end is the upstream's clean end.
func (s *testStream) end() ([]byte, bool) {
	s.e.End()
	return s.take()
}

func (s *testStream) take() ([]byte, bool) {
	out := append([]byte(nil), s.e.Pending()...) // the stream reuses its buffer once consumed
	s.e.Consume(len(out))
	s.leak = s.e.Leak()
	return out, !s.e.Ended()
}

// bodyOf is a whole reply as the client gets it; false on a leak or a body that is not JSON.
func bodyOf(x *exchange, raw []byte) ([]byte, bool) {
	c := x.g.replies.NewCharge()
	defer c.Done()
	out, _, _, err := reply.Body(x.watch.Guard(), nil, raw, c)
	return out, err == nil
}
