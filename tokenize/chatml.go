package tokenize

import "strings"

// Message is one chat message as the gateway extracted it (text parts already joined).
type Message struct{ Role, Name, Content string }

// ChatML control strings, shared with the simulator through sglang-api.md ("Chat template").
const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>\n"
	// assistantPrefix ends every rendered prompt: the engine counts it, so we do too.
	assistantPrefix = imStart + "assistant\n"
)

// RenderChatML renders messages the way kvgate and the simulator both do (sglang-api.md, "Chat
// template"): each message becomes `<|im_start|>{role}\n{content}<|im_end|>\n`, then the prompt
// ends with `<|im_start|>assistant\n`.
//
// A message with a Name renders its role line as `{role} name={name}`, so the name is part of the
// counted text (OpenAI's API accepts `name` on messages, and an engine's template puts it in the
// prompt in some form; this one is ours and the simulator's).
//
// extra (tools / functions / response_format JSON, already serialized by the caller) is appended
// as its own system block, `<|im_start|>system\n{extra}<|im_end|>\n`, after the messages and
// before the assistant line, when non-empty: the engine sees that text too, so it must be counted.
func RenderChatML(msgs []Message, extra string) string {
	size := len(assistantPrefix)
	for _, m := range msgs {
		size += len(imStart) + len(m.Role) + 1 + len(m.Content) + len(imEnd)
		if m.Name != "" {
			size += len(" name=") + len(m.Name)
		}
	}
	if extra != "" {
		size += len(imStart) + len("system\n") + len(extra) + len(imEnd)
	}
	var b strings.Builder
	b.Grow(size)
	for _, m := range msgs {
		b.WriteString(imStart)
		b.WriteString(m.Role)
		if m.Name != "" {
			b.WriteString(" name=")
			b.WriteString(m.Name)
		}
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString(imEnd)
	}
	if extra != "" {
		b.WriteString(imStart)
		b.WriteString("system\n")
		b.WriteString(extra)
		b.WriteString(imEnd)
	}
	b.WriteString(assistantPrefix)
	return b.String()
}

// ByteBound is a sound upper bound on any engine's token count for text: len(text).
//
// Why it is sound: every tokenizer in use is either byte-level BPE (tiktoken, GPT-2 style), whose
// tokens are non-empty byte strings that tile the text, or SentencePiece with byte fallback, whose
// tokens are non-empty pieces or single bytes; either way a token covers at least one UTF-8 byte,
// so no engine emits more tokens than the text has bytes. Special tokens that an engine adds
// outside the text (a BOS token) are the template's business, not this bound's.
func ByteBound(text string) int { return len(text) }
