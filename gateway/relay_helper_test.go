package gateway

import (
	"github.com/kvgate/kvgate/canary"
)

// testStream drives the stream relay (parse, decode, scan, re-serialise) one raw chunk at a time,
// as relayReader does, without a network.
type testStream struct {
	e    *eventRelay
	leak *canary.Hit
}

func streamOf(x *exchange) *testStream { return &testStream{e: x.newEventRelay(nil)} }

// event writes raw upstream bytes and returns what the client gets for them, and false once the
// stream was ended (a leak or a refused event).
func (s *testStream) event(raw []byte) ([]byte, bool) {
	s.e.write(raw)
	return s.take()
}

// end is the upstream's clean end.
func (s *testStream) end() ([]byte, bool) {
	s.e.end()
	return s.take()
}

func (s *testStream) take() ([]byte, bool) {
	out := s.e.out
	s.e.out = nil
	if s.e.guard != nil {
		s.leak = s.e.guard.leak
	}
	return out, !s.e.ended
}

// bodyOf is a whole reply as the client gets it; false on a leak or a body that is not JSON.
func bodyOf(x *exchange, raw []byte) ([]byte, bool) {
	c := x.g.newCharge()
	defer c.done()
	out, _, err := x.normaliseBody(nil, raw, c)
	return out, err == nil
}
