package tenants

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/limits"
	"github.com/kvgate/kvgate/state"
)

// The admin API's tenant records: the body of a create or update, its validation, and the
// answers for store errors. The HTTP handlers are the admin package's (admin/tenants.go).

// Fields is a POST or PATCH body; nil fields are absent (PATCH keeps them).
type Fields struct {
	Name            *string `json:"name"`
	KeySHA256       *string `json:"key_sha256"`
	MaxPromptTokens *int    `json:"max_prompt_tokens"`
	CanaryOptOut    *bool   `json:"canary_opt_out"`
	RPM             *int    `json:"rpm"`
	TPM             *int    `json:"tpm"`
	MaxConcurrent   *int    `json:"max_concurrent"`
}

// DecodeFields reads a tenant body; a raw key is refused by name.
func DecodeFields(body []byte) (*Fields, *apierr.Error) {
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) == nil {
		for _, k := range []string{"key", "api_key"} {
			if _, ok := probe[k]; ok {
				return nil, apierr.BadRequest(k, "Send 'key_sha256', the hex SHA-256 of the key (printf %s KEY | sha256sum); kvgate never accepts or stores a key itself.")
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var f Fields
	if err := dec.Decode(&f); err != nil {
		return nil, apierr.BadRequest("", "Invalid tenant JSON: "+err.Error())
	}
	return &f, nil
}

// ValidName: 1 to 64 letters, digits, '-', '_' or '.'.
func ValidName(n string) bool {
	if n == "" || len(n) > 64 {
		return false
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// Apply merges f into r and validates the result.
func (f *Fields) Apply(r *state.TenantRecord) *apierr.Error {
	if f.KeySHA256 != nil {
		r.KeySHA256 = strings.ToLower(*f.KeySHA256)
	}
	if h, err := hex.DecodeString(r.KeySHA256); err != nil || len(h) != 32 {
		return apierr.BadRequest("key_sha256", "'key_sha256' must be 64 hex characters (the SHA-256 of the tenant's API key).")
	}
	for _, v := range []struct {
		name string
		src  *int
		dst  *int
	}{{"max_prompt_tokens", f.MaxPromptTokens, &r.MaxPromptTokens}, {"rpm", f.RPM, &r.RPM}, {"tpm", f.TPM, &r.TPM},
		{"max_concurrent", f.MaxConcurrent, &r.MaxConcurrent}} {
		if v.src == nil {
			continue
		}
		if *v.src < 0 {
			return apierr.BadRequest(v.name, fmt.Sprintf("'%s' must be ≥ 0 (0 = no limit).", v.name))
		}
		*v.dst = *v.src
	}
	if f.CanaryOptOut != nil {
		r.CanaryOptOut = *f.CanaryOptOut
	}
	return nil
}

// StoreError maps a tenant store's error to the admin API's answer.
func StoreError(err error, name string) *apierr.Error {
	switch {
	case errors.Is(err, state.ErrTenantExists):
		return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "tenant_exists", Param: "name",
			Message: fmt.Sprintf("A tenant named %q exists.", name)}
	case errors.Is(err, state.ErrKeyInUse):
		return KeyInUse()
	case errors.Is(err, state.ErrTenantNotFound):
		return NotFound(name)
	}
	return apierr.StateUnavailable("The tenant store is unreachable; nothing was changed: " + err.Error())
}

// KeyInUse: the key belongs to another tenant.
func KeyInUse() *apierr.Error {
	return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "key_in_use", Param: "key_sha256",
		Message: "This key belongs to another tenant."}
}

// NotFound: no run-time tenant of that name.
func NotFound(name string) *apierr.Error {
	return &apierr.Error{Status: 404, Type: "invalid_request_error", Code: "not_found", Param: "tenant",
		Message: fmt.Sprintf("No run-time tenant named %q.", name)}
}

// ConfigTenantError: config-file tenants change in the file only.
func ConfigTenantError(name string) *apierr.Error {
	return &apierr.Error{Status: 409, Type: "invalid_request_error", Code: "config_tenant", Param: "tenant",
		Message: fmt.Sprintf("Tenant %q is defined in the config file; change it there.", name)}
}

// View is one row of GET /admin/tenants; the key hash is shown by its first 8 characters.
type View struct {
	Name            string `json:"name"`
	Source          string `json:"source"`
	KeyPrefix       string `json:"key_sha256_prefix"`
	MaxPromptTokens int    `json:"max_prompt_tokens"`
	CanaryOptOut    bool   `json:"canary_opt_out"`
	limits.Rates
}

// ViewOf is r as a View.
func ViewOf(r state.TenantRecord, source string) View {
	return View{Name: r.Name, Source: source, KeyPrefix: r.KeySHA256[:min(8, len(r.KeySHA256))],
		MaxPromptTokens: r.MaxPromptTokens, CanaryOptOut: r.CanaryOptOut, Rates: r.Rates}
}
