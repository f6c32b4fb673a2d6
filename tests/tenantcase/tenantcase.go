// Package tenantcase is a test helper: a tenant record with every attribute set, so tests of the
// stores, the directory and the admin API see an attribute added to config.Tenant without being
// told of it.
package tenantcase

import (
	"fmt"
	"reflect"

	"github.com/kvgate/kvgate/config"
)

// Full is a valid tenant named name whose key is the SHA-256 of key, with every other attribute
// set away from its zero and default value: integers 11, 12, … in field order, booleans true,
// numbers (weight) 4.
func Full(name, key string) config.Tenant {
	t := config.Tenant{Name: name, KeySHA256: config.SHA256Hex(key)}
	v := reflect.ValueOf(&t).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(11 + i))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Float64:
			f.SetFloat(4)
		case reflect.String:
			if f.String() == "" {
				panic(fmt.Sprintf("tenantcase: config.Tenant.%s is a string it does not know how to set", v.Type().Field(i).Name))
			}
		default:
			panic(fmt.Sprintf("tenantcase: config.Tenant.%s has a kind it does not know (%s)", v.Type().Field(i).Name, f.Kind()))
		}
	}
	return t
}
