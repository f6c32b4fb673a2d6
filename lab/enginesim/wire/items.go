package wire

import "encoding/json"

// bootFields decodes bootstrap_host/port/room, single or batched, for n items.
func bootFields(host, port, roomRaw json.RawMessage, n int) ([]Boot, error) {
	out := make([]Boot, n)
	if IsNull(roomRaw) && IsNull(host) {
		return out, nil
	}
	hosts, _, err := Strings(host, "bootstrap_host")
	if err != nil {
		return nil, err
	}
	var rooms []uint64
	if IsArray(roomRaw) {
		if err := json.Unmarshal(roomRaw, &rooms); err != nil {
			return nil, Badf("bootstrap_room: want integers in [0, 2^63-1]")
		}
	} else if !IsNull(roomRaw) {
		var r uint64
		if err := json.Unmarshal(roomRaw, &r); err != nil {
			return nil, Badf("bootstrap_room: want an integer in [0, 2^63-1]")
		}
		rooms = []uint64{r}
	}
	var ports []int
	if IsArray(port) {
		var ps []*int
		if err := json.Unmarshal(port, &ps); err != nil {
			return nil, Badf("bootstrap_port: want an integer or null")
		}
		for _, p := range ps {
			if p == nil {
				ports = append(ports, 0)
			} else {
				ports = append(ports, *p)
			}
		}
	} else if !IsNull(port) {
		var p int
		if err := json.Unmarshal(port, &p); err != nil {
			return nil, Badf("bootstrap_port: want an integer or null")
		}
		ports = []int{p}
	}
	pick := func(i, l int) int {
		if l == 1 {
			return 0
		}
		return i
	}
	if len(rooms) == 0 {
		return nil, Badf("bootstrap_room is required with bootstrap_host")
	}
	for _, l := range []int{len(hosts), len(rooms), len(ports)} {
		if l > 1 && l != n {
			return nil, Badf("bootstrap fields: batched lists must have one entry per prompt (%d)", n)
		}
	}
	for i := range out {
		out[i].Has = true
		out[i].Room = rooms[pick(i, len(rooms))]
		if len(hosts) > 0 {
			out[i].Host = hosts[pick(i, len(hosts))]
		} else {
			out[i].Host = "127.0.0.1"
		}
		if len(ports) > 0 {
			out[i].Port = ports[pick(i, len(ports))]
		}
		if out[i].Port < 0 || out[i].Port > 65535 {
			return nil, Badf("bootstrap_port: %d is not a port", out[i].Port)
		}
	}
	return out, nil
}

// Item is one prompt of a request (a batch holds several), as parsed; the
// engine fills IDs and Texts when it tokenizes Prompt.
type Item struct {
	RID         string
	Prompt      string   // rendered text; used when IDs is nil
	IDs         []uint32 // input_ids, or the tokenization of Prompt
	Texts       []string
	MaxNew      int  // tokens to generate
	MaxNewGiven bool // whether MaxNew takes part in the prompt+output check
	Boot        Boot
	Tenant      string
	Salt        string // the prefix-cache salt (cache_salt, extra_key or X-Cache-Salt); "" = none
	// ThinkBudget is thinking_token_budget (0 = none): the reasoning tokens before the engine
	// forces the reasoning-end string.
	ThinkBudget int
}

// Boot is an item's PD bootstrap fields.
type Boot struct {
	Has  bool
	Host string
	Port int // 0 = null: use the configured port
	Room uint64
}

// Env is what the parsers need from the server: a request id for a prompt
// that carries none, and a sink for the prefix-cache salts a body names.
type Env struct {
	NewRID    func() string
	NoteSalts func(salts []string)
	// RenderChat, when set, renders a chat completions body with the model's own chat
	// template (--tokenizer hf:DIR) instead of ChatML.
	RenderChat func(body []byte) (string, error)
	// Images: chat image_url parts are accepted (RenderChat charges them); otherwise refused.
	Images bool
}

// NoteSalt decodes a salt field (a string or a list of strings), hands
// its values to NoteSalts and returns them.
func (e Env) NoteSalt(raw json.RawMessage, field string) ([]string, error) {
	salts, _, err := Strings(raw, field)
	if err != nil {
		return nil, err
	}
	e.NoteSalts(salts)
	return salts, nil
}

// SaltFor is item i's salt: one salt serves every item, a list names one per item.
func SaltFor(salts []string, i int) string {
	switch {
	case len(salts) == 1:
		return salts[0]
	case i < len(salts):
		return salts[i]
	}
	return ""
}

// EngineFields are the SGLang extensions every generation body may carry:
// the request id, the PD bootstrap fields and the prefix-cache salt.
type EngineFields struct {
	RID           json.RawMessage `json:"rid"`
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
	CacheSalt     json.RawMessage `json:"cache_salt"`
}

// SingleItem builds the one item of a chat-like route (one rendered prompt).
func SingleItem(env Env, prompt string, maxNew int, given bool, f EngineFields, tenant string) (*Item, error) {
	salts, err := env.NoteSalt(f.CacheSalt, "cache_salt")
	if err != nil {
		return nil, err
	}
	rids, _, err := Strings(f.RID, "rid")
	if err != nil {
		return nil, err
	}
	boots, err := bootFields(f.BootstrapHost, f.BootstrapPort, f.BootstrapRoom, 1)
	if err != nil {
		return nil, err
	}
	it := &Item{Prompt: prompt, MaxNew: maxNew, MaxNewGiven: given, Boot: boots[0], Tenant: tenant, Salt: SaltFor(salts, 0)}
	if len(rids) > 0 {
		it.RID = rids[0]
	}
	if it.RID == "" {
		it.RID = env.NewRID()
	}
	return it, nil
}
