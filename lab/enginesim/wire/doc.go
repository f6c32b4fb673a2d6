// Package wire is the simulator's HTTP wire format, with no engine state:
// it decodes the request bodies of every route (SGLang's /generate, OpenAI's
// completions, chat and responses, Anthropic's messages, the prefill-only
// routes) into typed requests and prompt items, renders prompts (ChatML),
// and defines the reply objects, the three error envelopes and the
// event-stream framing the handlers write. Parsers are pure functions of the
// body; the only things they need from a server come through Env.
//
// Like the rest of lab/enginesim it imports no gateway package: it is the
// engine's side of the protocol, written independently of the gateway's.
package wire
