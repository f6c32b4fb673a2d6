package gateway

// Routing by model. With no model configured anywhere the gateway fronts one model and this
// table has a single entry ""; otherwise a request's "model" (a name or an alias) picks the
// engines that serve it, and each model counts tokens with its own tokenizer, safety ratio and
// engine calibrations (one admission.Counter each).

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvgate/kvgate/admission"
	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/backends"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/policy"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/tokenize"
	"github.com/kvgate/kvgate/tokenize/hf"
	"github.com/kvgate/kvgate/tokenize/vision"
)

type modelTable struct {
	multi bool
	names []string          // served models, in configuration order
	ids   map[string]string // name or alias → name
	// fallback is the model of routes whose body has no "model" field (SGLang's native
	// /generate, /encode, /classify): the first one configured.
	fallback string
	counters map[string]*admission.Counter
	// templates: with a tokenizer.hf_dir, the model's own chat template renders its chat prompts
	// (nil: the generic render).
	templates map[string]request.ChatTemplate
	// images: the model's image rule, from preprocessor_config.json in its tokenizer.hf_dir
	// (nil: images are refused); remoteAtMax: tokenizer.remote_images is count_max.
	images      map[string]*vision.Rule
	remoteAtMax map[string]bool
	// switches: the chat_template_kwargs keys a model's own template reads beyond
	// request.StandardSwitches (found by reading the template; none without tokenizer.hf_dir).
	switches map[string]map[string]bool
	aliases  map[string][]string // name → its aliases, for /v1/models
}

// acceptsSwitch says whether model's chat template reads the chat_template_kwargs key k (for
// request.CheckTemplateSwitches).
func (t *modelTable) acceptsSwitch(model string) func(string) bool {
	sw := t.switches[model]
	return func(k string) bool { return sw[k] }
}

// imageRule is model's image rule, or nil.
func (t *modelTable) imageRule(model string) *vision.Rule { return t.images[model] }

// template is model's chat template, or nil.
func (t *modelTable) template(model string) request.ChatTemplate { return t.templates[model] }

// modelTab is the model table in force (Reload swaps it).
func (g *Gateway) modelTab() *modelTable { return g.models.Load() }

// pol is the admission policy in force (Reload swaps it).
func (g *Gateway) pol() *config.Policy { return g.policy.Load() }

func newModelTable(cfg *config.Config, set *backends.Set, ratio *tokenize.SafetyRatio, m *metrics, log *zap.Logger) (*modelTable, error) {
	t := &modelTable{multi: cfg.MultiModel(), ids: map[string]string{}, counters: map[string]*admission.Counter{},
		templates: map[string]request.ChatTemplate{}, aliases: map[string][]string{},
		images: map[string]*vision.Rule{}, remoteAtMax: map[string]bool{}, switches: map[string]map[string]bool{}}
	names := []string{""}
	if t.multi {
		names = cfg.ModelNames()
		t.fallback = names[0]
		for _, mod := range cfg.Models {
			for _, a := range mod.Aliases {
				t.ids[a] = mod.Name
			}
			t.aliases[mod.Name] = mod.Aliases
		}
	}
	t.names = names
	for _, name := range names {
		t.ids[name] = name
		tk := cfg.ModelTokenizer(name)
		var (
			enc tokenize.Encoder
			err error
			// hfTok, with tokenizer.hf_dir: the model's own tokenizer and chat template, whose
			// counts are exact (no engine needs to be asked).
			hfTok      *hf.Tokenizer
			encodeAdds int
		)
		if tk.HFDir != "" {
			if hfTok, err = hf.Load(tk.HFDir); err != nil {
				return nil, fmt.Errorf("tokenizer.hf_dir (model %q): %w", name, err)
			}
			enc, encodeAdds = hfTok, hfTok.EncodeAdds
			t.templates[name] = hfTok
			rule, err := vision.Load(tk.HFDir)
			switch {
			case err == nil:
				t.images[name] = rule
				t.remoteAtMax[name] = tk.RemoteImages == config.RemoteImagesCountMax
			case errors.Is(err, vision.ErrNoRule):
			case errors.Is(err, vision.ErrUnsupported):
				log.Warn("image parts will be refused for this model", zap.String("model", name), zap.Error(err))
			default:
				return nil, fmt.Errorf("tokenizer.hf_dir (model %q): %w", name, err)
			}
			sw := map[string]bool{}
			for _, v := range hfTok.TemplateVariables() {
				if !request.IsRefusedSwitch(v) && !request.StandardSwitches[v] {
					sw[v] = true // rendered by the model's own template here: counted exactly
				}
			}
			t.switches[name] = sw
		} else if enc, err = tokenize.NewEncoder(string(tk.Library), tk.Encoding); err != nil {
			return nil, fmt.Errorf("building tokenizer (model %q): %w", name, err)
		}
		r := ratio // the top-level tokenizer's ratio is shared by every model that uses it
		if name != "" && tk != cfg.Tokenizer {
			r = tokenize.NewSafetyRatio(tk.SafetyRatio, tk.SafetyRatioMax)
		}
		t.counters[name] = admission.New(admission.Options{Encoder: enc, Ratio: r, Set: set,
			ExactConcurrency: tk.ExactConcurrency, ExactTimeout: tk.ExactTimeout,
			SafetyRatio: tk.SafetyRatio, CalibrationRetryMax: tk.CalibrationRetryMax,
			PollInterval: cfg.Capacity.PollInterval, Log: log, LocalExact: hfTok != nil, LocalTextOverhead: encodeAdds,
			ExactCalls: m.exactCalls, Calibrations: m.calibrations})
	}
	return t, nil
}

// counter is model's Counter (the fallback's for a model not served, which has no engines).
func (t *modelTable) counter(model string) *admission.Counter {
	if c := t.counters[model]; c != nil {
		return c
	}
	return t.counters[t.fallback]
}

// resolve maps a request's model field to the model served: "" in single-model mode; a name or
// alias otherwise. A route with a model field must name one (400); an unknown one is 404
// model_not_found, OpenAI's answer.
func (t *modelTable) resolve(kind request.Kind, given string, hasField bool) (string, *apierr.Error) {
	if !t.multi {
		return "", nil
	}
	if name, ok := t.ids[given]; ok {
		return name, nil
	}
	if given == "" {
		if !hasField {
			return t.fallback, nil
		}
		return "", apierr.BadRequest("model", fmt.Sprintf("You must provide a model parameter (one of: %s).", strings.Join(t.names, ", ")))
	}
	return "", apierr.ModelNotFound(given)
}

// routesFor is the routes of model now; model "" (one model: no backend names one) is every
// route. Decided by the name the request resolved, not by the table in force, so a reload
// between the two cannot mix them.
func (g *Gateway) routesFor(model string) ([]backends.Route, error) {
	if model == "" {
		return g.backends.Routes(time.Now())
	}
	return g.backends.RoutesFor(model, time.Now())
}

// modelHasField: the route's body names its model (every OpenAI and Anthropic route; not
// SGLang's native ones).
func modelHasField(kind request.Kind) bool { return request.Allows(kind, "model") }

// listModels answers /v1/models (every model) and /v1/models/{id} (one, by name or alias). Each
// model's max_model_len is the largest prompt some healthy path of its own admits for this
// tenant, so clients that size prompts from it never get a 413.
func (g *Gateway) listModels(ctx *fasthttp.RequestCtx, id string, one bool) {
	t := g.authenticate(ctx)
	if t == nil {
		writeError(ctx, apierr.Unauthorized)
		return
	}
	entry := func(name string) (map[string]any, *apierr.Error) {
		routes, err := g.routesFor(name)
		if err != nil {
			return nil, routeError(err)
		}
		paths := make([]policy.Path, len(routes))
		served := name
		for i, r := range routes {
			paths[i] = r.Path
			if served == "" { // one model: the id the engines report
				for _, b := range []*backends.Backend{r.Unified, r.Decode} {
					if b != nil && b.Capacity() != nil {
						served = b.Capacity().Model
					}
				}
			}
		}
		limit := max(policy.Limit(paths, admission.RuleOutput(0, false, 1, g.pol().DefaultMaxTokens), t.MaxPromptTokens), 0)
		m := map[string]any{"id": served, "object": "model", "owned_by": "kvgate", "root": served, "max_model_len": limit}
		if aliases := g.modelTab().aliases[name]; len(aliases) > 0 {
			m["aliases"] = aliases
		}
		return m, nil
	}
	var body []byte
	if one {
		name, e := "", (*apierr.Error)(nil)
		if g.modelTab().multi {
			name, e = g.modelTab().resolve(request.Chat, id, true)
		}
		var m map[string]any
		if e == nil {
			m, e = entry(name)
		}
		if e == nil && !g.modelTab().multi && m["id"] != id {
			e = apierr.ModelNotFound(id)
		}
		if e != nil {
			writeError(ctx, e)
			return
		}
		body, _ = json.Marshal(m)
	} else {
		data := []any{}
		for _, name := range g.modelTab().names {
			m, e := entry(name)
			if e != nil {
				if g.modelTab().multi {
					// A model whose engines are all down is listed with nothing admitted, not
					// dropped: clients see it exists and that it cannot take a prompt now.
					m = map[string]any{"id": name, "object": "model", "owned_by": "kvgate", "root": name, "max_model_len": 0}
				} else {
					writeError(ctx, e)
					return
				}
			}
			data = append(data, m)
		}
		body, _ = json.Marshal(map[string]any{"object": "list", "data": data})
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}
