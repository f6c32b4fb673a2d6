package wire

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// DefaultOpenAIMaxTokens is how many tokens the OpenAI routes generate when
// the body asks for no limit; like SGLang, such a request takes no part in
// the prompt+output check.
const DefaultOpenAIMaxTokens = 16

// Route is one of the generation routes that share the item parsers.
type Route int

// Path is the route's URL path.
func (r Route) Path() string {
	switch r {
	case RouteCompletions:
		return "/v1/completions"
	case RouteChat:
		return "/v1/chat/completions"
	}
	return "/generate"
}

type openAIError struct {
	Object  string  `json:"object"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// WriteOpenAIError answers status in OpenAI's error envelope (as SGLang renders it).
func WriteOpenAIError(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	b, _ := Marshal(openAIError{Object: "error", Message: msg, Type: typ, Code: status})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// OpenAIReq is a /v1/completions or /v1/chat/completions body.
type OpenAIReq struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	User          string          `json:"user"`
	RID           json.RawMessage `json:"rid"`
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
	CacheSalt     json.RawMessage `json:"cache_salt"`
	// ThinkingTokenBudget bounds the reasoning tokens (vLLM's thinking_token_budget).
	ThinkingTokenBudget int `json:"thinking_token_budget"`
}

// RenderChatML renders messages as the simulator counts them: each message
// "<|im_start|>{role}\n{content}<|im_end|>\n", then "<|im_start|>assistant\n".
func RenderChatML(roles, contents []string) string {
	var b strings.Builder
	for i := range roles {
		b.WriteString("<|im_start|>")
		b.WriteString(roles[i])
		b.WriteByte('\n')
		b.WriteString(contents[i])
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.String()
}

func messageText(raw json.RawMessage, images bool) (string, error) {
	if IsNull(raw) {
		return "", nil
	}
	if !IsArray(raw) {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", Badf("messages[].content: want a string or a list of parts")
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", Badf("messages[].content: want a string or a list of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if images && p.Type == "image_url" {
			continue // no text; the model's template and processor render it
		}
		if p.Type != "text" || p.Text == nil {
			return "", Badf("messages[].content: only text parts are supported, got %q", p.Type)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// ParseOpenAI decodes a /v1/completions or /v1/chat/completions body into
// its items (n per prompt) and, for each item, the index of its prompt.
func ParseOpenAI(env Env, r Route, body []byte) (*OpenAIReq, []*Item, []int, error) {
	var req OpenAIReq
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, nil, Badf("invalid JSON body: %v", err)
	}
	salts, err := env.NoteSalt(req.CacheSalt, "cache_salt")
	if err != nil {
		return nil, nil, nil, err
	}
	var prompts []string
	var idPrompts [][]uint32
	if r == RouteChat {
		if len(req.Messages) == 0 {
			return nil, nil, nil, Badf("messages: at least one message is required")
		}
		roles := make([]string, len(req.Messages))
		contents := make([]string, len(req.Messages))
		for i, m := range req.Messages {
			if m.Role == "" {
				return nil, nil, nil, Badf("messages[%d].role is required", i)
			}
			t, err := messageText(m.Content, env.Images)
			if err != nil {
				return nil, nil, nil, err
			}
			roles[i], contents[i] = m.Role, t
		}
		prompts = []string{RenderChatML(roles, contents)}
		if env.RenderChat != nil {
			text, err := env.RenderChat(body)
			if err != nil {
				return nil, nil, nil, Badf("%v", err)
			}
			prompts[0] = text
		}
	} else {
		ps, _, err := Strings(req.Prompt, "prompt")
		if err != nil {
			ids, _, err2 := IDLists(req.Prompt, "prompt")
			if err2 != nil {
				return nil, nil, nil, err
			}
			idPrompts = ids
		} else {
			prompts = ps
		}
		if len(prompts)+len(idPrompts) == 0 {
			return nil, nil, nil, Badf("prompt is required")
		}
	}
	maxNew, given := DefaultOpenAIMaxTokens, false
	if req.MaxCompletionTokens != nil {
		maxNew, given = *req.MaxCompletionTokens, true
	} else if req.MaxTokens != nil {
		maxNew, given = *req.MaxTokens, true
	}
	if maxNew < 0 {
		return nil, nil, nil, Badf("max_tokens must not be negative")
	}
	n := 1
	if req.N != nil {
		n = *req.N
	}
	if n < 1 || n > 128 {
		return nil, nil, nil, Badf("n must be between 1 and 128")
	}
	nPrompts := len(prompts) + len(idPrompts)
	rids, _, err := Strings(req.RID, "rid")
	if err != nil {
		return nil, nil, nil, err
	}
	base := ""
	if len(rids) > 0 {
		base = rids[0]
	}
	if base == "" {
		base = env.NewRID()
	}
	boots, err := bootFields(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom, nPrompts)
	if err != nil {
		return nil, nil, nil, err
	}
	var items []*Item
	var promptOf []int
	for pi := 0; pi < nPrompts; pi++ {
		for c := 0; c < n; c++ {
			it := &Item{MaxNew: maxNew, MaxNewGiven: given, Boot: boots[pi], Tenant: req.User, Salt: SaltFor(salts, 0), ThinkBudget: req.ThinkingTokenBudget}
			if prompts != nil {
				it.Prompt = prompts[pi]
			} else {
				it.IDs = idPrompts[pi]
			}
			it.RID = base
			if len(items) > 0 {
				it.RID = base + "-" + strconv.Itoa(len(items))
			}
			items = append(items, it)
			promptOf = append(promptOf, pi)
		}
	}
	return &req, items, promptOf, nil
}

// Usage is an OpenAI reply's usage.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails carries cached_tokens, as SGLang's --enable-cache-report does.
	PromptTokensDetails *PromptDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptDetails is usage.prompt_tokens_details.
type PromptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ChatMessageOut is a chat choice's message.
type ChatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Choice is one choice of a completion or chunk.
type Choice struct {
	Index        int             `json:"index"`
	Message      *ChatMessageOut `json:"message,omitempty"`
	Text         *string         `json:"text,omitempty"`
	Delta        *Delta          `json:"delta,omitempty"`
	Logprobs     any             `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	MatchedStop  any             `json:"matched_stop"`
}

// Delta is a chat chunk's delta.
type Delta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// Completion is a completion, chat completion or chunk object.
type Completion struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []Choice `json:"choices"`
	Usage   *Usage   `json:"usage,omitempty"`
}

// Strp returns a pointer to s.
func Strp(s string) *string { return &s }

// The generation routes.
const (
	RouteGenerate Route = iota
	RouteCompletions
	RouteChat
)
