package tenants

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/kvgate/kvgate/apierr"
	"github.com/kvgate/kvgate/config"
	"github.com/kvgate/kvgate/request"
	"github.com/kvgate/kvgate/state"
)

// The admin API's tenant records: the body of a create or update, its validation, and the
// answers for store errors. The HTTP handlers are the admin package's (admin/tenants.go).

// Decode merges a POST or PATCH body into r: the body is the tenant record itself (config.Tenant's
// JSON), so every attribute a file tenant has can be set at run time; an absent attribute keeps
// r's value (PATCH). A raw key is refused by name; the key hash is kept in lower case. Check the
// result with Validate once the name is checked (ValidName; a PATCH cannot rename).
func Decode(body []byte, r *config.Tenant) *apierr.Error {
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) == nil {
		for _, k := range []string{"key", "api_key"} {
			if _, ok := probe[k]; ok {
				return apierr.BadRequest(k, "'"+k+"' is refused: send 'key_sha256', the hex SHA-256 of the key (printf %s KEY | sha256sum); kvgate never accepts or stores a key itself.")
			}
		}
	}
	// encoding/json keeps the last of two equal keys and matches keys case-insensitively, so
	// "rpm":5,"rpm":0 would store no limit: refused, naming the key, as every route refuses it.
	if e := request.CheckKeys(body); e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return apierr.BadRequest("", "Invalid tenant JSON: one object expected.")
	}
	r.KeySHA256 = strings.ToLower(r.KeySHA256)
	r.SetDefaults()
	return nil
}

// Validate checks r's attributes as the file's tenants are checked (config.Tenant.Check): the
// first error, naming its field.
func Validate(r *config.Tenant) *apierr.Error {
	if r.KeySHA256 == "" {
		return apierr.BadRequest("key_sha256", "'key_sha256' is required (the hex SHA-256 of the tenant's API key).")
	}
	var e *apierr.Error
	r.Check(func(field, format string, args ...any) {
		if e == nil {
			e = apierr.BadRequest(field, fmt.Sprintf("'%s' %s.", field, fmt.Sprintf(format, args...)))
		}
	})
	return e
}

// decodeError names the field a body's JSON got wrong where the decoder says which.
func decodeError(err error) *apierr.Error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return apierr.BadRequest(te.Field, fmt.Sprintf("'%s' must be a JSON %s, got %s.", te.Field, jsonType(te.Type.Kind()), te.Value))
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		f = strings.Trim(f, `"`)
		return apierr.BadRequest(f, fmt.Sprintf("Unknown tenant field '%s'.", f))
	}
	return apierr.BadRequest("", "Invalid tenant JSON: "+err.Error())
}

func jsonType(k reflect.Kind) string {
	switch k {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int64:
		return "integer"
	}
	return "number"
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

// View is one row of GET /admin/tenants: the record, where it comes from, and the key hash
// shown by its first 8 characters only.
type View struct {
	config.Tenant
	// KeySHA256 hides the record's full hash (the shallower field wins in encoding/json, and
	// empty it is omitted).
	KeySHA256 string `json:"key_sha256,omitempty"`
	Source    string `json:"source"`
	KeyPrefix string `json:"key_sha256_prefix"`
}

// ViewOf is t as a View.
func ViewOf(t config.Tenant, source string) View {
	return View{Tenant: t, Source: source, KeyPrefix: t.KeySHA256[:min(8, len(t.KeySHA256))]}
}
