package reply

import "github.com/kvgate/kvgate/canary"

// funcSink is a Sink of test functions (nil: nothing done).
type funcSink struct {
	leak   func()
	passed func(carriesText bool)
}

func (f funcSink) Value(any) {}

func (f funcSink) Passed(carriesText bool) {
	if f.passed != nil {
		f.passed(carriesText)
	}
}

func (f funcSink) Leak(canary.Hit) {
	if f.leak != nil {
		f.leak()
	}
}

func (f funcSink) Failed(string, error) {}

var _ Sink = funcSink{}
