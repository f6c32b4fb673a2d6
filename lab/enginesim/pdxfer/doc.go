// Package pdxfer is the simulated KV transfer between a prefill and a
// decode server: prefill's room store (what it computed for each
// bootstrap_room, held until decode pulls it once or it expires, or the
// room's abort), the bootstrap port's handler that serves it, and decode's
// client that pulls it over loopback HTTP.
//
// Like the rest of lab/enginesim it imports no gateway package.
package pdxfer
