package policy

import (
	"cmp"
	"slices"
)

// Order is the order in which paths are tried: least load first, paths of equal load in random
// order (shuffle is given n and returns a random index below it), so equal paths share traffic
// instead of the first configured one taking it all. It is the one selector the gateway uses.
func Order(loads []int64, intn func(n int) int) []int {
	return OrderInto(make([]int, 0, len(loads)), loads, intn)
}

// OrderInto is Order written into dst's array (when it has the room): the caller's buffer, so a
// request's few paths are ordered without an allocation.
func OrderInto(dst []int, loads []int64, intn func(n int) int) []int {
	order := dst[:0]
	for i := range loads {
		order = append(order, i)
	}
	// Shuffle, then sort stably by load: ties keep their random order.
	for i := len(order) - 1; i > 0; i-- {
		j := intn(i + 1)
		order[i], order[j] = order[j], order[i]
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(loads[a], loads[b]) })
	return order
}

// Reasons a prompt is refused, the binding limit named.
const (
	ReasonOK              = "ok"
	ReasonContextLength   = "context_length_exceeded"  // the engines' limits (max_req_input_len, context, output)
	ReasonTenantMaxPrompt = "tenant_max_prompt_tokens" // the tenant's own cap, where the engines would admit
)

// Reason says which limit refused a prompt of tokens tokens when no path admits it: the
// tenant's cap when some path's engine limits would have admitted it, else the engines'.
func Reason(paths []Path, tokens, output, tenantMax int) string {
	if tenantMax > 0 && tokens <= Limit(paths, output, 0) {
		return ReasonTenantMaxPrompt
	}
	return ReasonContextLength
}
