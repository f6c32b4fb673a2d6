package reply

import (
	"errors"

	"github.com/kvgate/kvgate/canary"
)

// Hit is a foreign marker found in a reply.
type Hit = canary.Hit

// ErrLeak: the reply carried a foreign marker.
var ErrLeak = errors.New("foreign canary marker in the reply")

// ErrMalformed: the reply breaks a rule clients rely on to assemble it (an index that is not a
// non-negative JSON integer); it is not passed on.
var ErrMalformed = errors.New("reply index is not a non-negative JSON integer")

// Body is a whole reply as the client will get it: transcoded to UTF-8, decoded as one JSON
// value, scanned by gd (nil: canaries off; engine errors too: they may quote the prompt they
// refused), and re-serialised from the scanned value, or passed on as the engine wrote it when
// those bytes are canonical (canon.go) and the scan changed nothing (out is then body, or the
// part of it after a BOM). A body that is not JSON is still scanned as
// text, so a marker in it is recorded, but it is never passed on. Each step is charged to c
// before it allocates. Errors: ErrBudget when c refuses; ErrLeak with the hit; any other error
// means the body is not usable JSON.
func Body(gd *Guard, contentType, body []byte, c *Charge) (out []byte, v any, leak *Hit, err error) {
	return readBody(gd, contentType, body, c, false)
}

// BodyUsage is Body for a caller that reads only usage from v (backends.ReadUsage,
// backends.PromptCount): a canonical body that is one object is scanned in place without being
// decoded (inplace.go), and v is that object with only the members usage is read from.
func BodyUsage(gd *Guard, contentType, body []byte, c *Charge) (out []byte, v any, leak *Hit, err error) {
	return readBody(gd, contentType, body, c, true)
}

func readBody(gd *Guard, contentType, body []byte, c *Charge, usageOnly bool) (out []byte, v any, leak *Hit, err error) {
	if gd != nil {
		gd.spend = c.Spend
		defer gd.releaseKit() // the whole reply is scanned by the time this returns
	}
	cs := CharsetOf(contentType)
	if !c.Spend(int64(TranscodedLen(body, cs))) {
		return nil, nil, nil, ErrBudget
	}
	text, err := ToUTF8(body, cs)
	body = nil
	if err == nil && usageOnly {
		if out, v, leak, err, taken := bodyInPlace(gd, text, c); taken {
			return out, v, leak, err
		}
	}
	var shadowed []any
	if err == nil {
		v, shadowed, err = DecodeStrictSpending(text, c.Spend)
	}
	if errors.Is(err, ErrBudget) {
		return nil, nil, nil, err
	}
	if err != nil {
		if gd != nil && (!c.Spend(int64(len(text))) || !gd.detectIn(string(text), v, shadowed)) {
			if gd.overBudget || gd.leak == nil {
				return nil, nil, nil, ErrBudget
			}
			return nil, nil, gd.leak, ErrLeak
		}
		return nil, nil, nil, err
	}
	// Bytes every reader decodes to exactly the value decoded here (canon.go) are passed on as
	// they are when the scan changed nothing: no re-serialisation. They are the caller's (already
	// charged) buffer.
	var cr canonReader
	canonical := cr.read(text)
	cr = canonReader{}
	if !canonical {
		text = nil // the decoded value holds copies of everything it needs
	}
	changed := false
	if gd != nil {
		var ok bool
		if v, changed, ok = gd.body(v); !ok {
			if gd.overBudget {
				return nil, nil, nil, ErrBudget
			}
			if gd.malformed && gd.leak == nil {
				return nil, nil, nil, ErrMalformed
			}
			return nil, nil, gd.leak, ErrLeak
		}
	}
	if canonical && !changed {
		return text, v, nil, nil
	}
	n := JSONLen(v)
	if !c.Spend(int64(n)) {
		return nil, nil, nil, ErrBudget
	}
	return AppendJSON(make([]byte, 0, n), v), v, nil, nil
}
