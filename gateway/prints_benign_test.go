package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/tests/procs"
	"github.com/kvgate/kvgate/tests/testkit"
)

// Boilerplate that many tenants share: one system prompt, licence texts, code.
const benignSystem = "You are a careful assistant for a software company. Answer in plain English, cite the " +
	"documents the user gives you, and never invent facts. When you quote code, keep its formatting."

var benignLicences = []string{
	`Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the "Software"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions: The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software.`,
	`Redistribution and use in source and binary forms, with or without modification, are permitted provided that the following conditions are met: Redistributions of source code must retain the above copyright notice, this list of conditions and the following disclaimer. Redistributions in binary form must reproduce the above copyright notice, this list of conditions and the following disclaimer in the documentation and/or other materials provided with the distribution.`,
	`Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file except in compliance with the License. You may obtain a copy of the License at the project's web site. Unless required by applicable law or agreed to in writing, software distributed under the License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.`,
}

var benignCode = []string{
	"func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {\n\tif r.Method != http.MethodGet {\n\t\thttp.Error(w, \"method not allowed\", http.StatusMethodNotAllowed)\n\t\treturn\n\t}\n\tw.Header().Set(\"Content-Type\", \"application/json\")\n\t_ = json.NewEncoder(w).Encode(s.status())\n}",
	"def read_config(path):\n    with open(path) as f:\n        data = yaml.safe_load(f)\n    if 'backends' not in data:\n        raise ValueError('config: no backends')\n    return data",
	"for (const item of items) {\n  if (!item.enabled) continue;\n  results.push(await fetchItem(item.id, { timeout: 5000 }));\n}\nconsole.log(`fetched ${results.length} items`);",
}

// False alarms: 60 tenants share a system prompt, licence texts and code; their replies quote
// their own prompts and the shared text (the simulator's model quotes its context), on every
// generation route, streaming and not. Not one incident, not one cut.
func TestSharedBoilerplateRaisesNoIncident(t *testing.T) {
	sim := procs.StartSim(t, "--mode", "combined", "--pool-tokens", "65536", "--context-length", "16384", "--seed", "9")
	prefix := uniquePrefix(t)
	const tenants = 60
	gw := testkit.StartGateway(t, testkit.ParseConfig(t, printsYAML(prefix, "enforce", tenants, "", [3]string{"u0", sim.URL, "unified"})))
	paths := []string{"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses", "/v1/messages"}
	quotedShared := 0
	for round := 0; round < 2; round++ {
		for i := 0; i < tenants; i++ {
			licence, code := benignLicences[(i+round)%len(benignLicences)], benignCode[(i/2+round)%len(benignCode)]
			question := fmt.Sprintf("Question %d from tenant %d: %s", round, i, tenantProse(uint64(1000+i*10+round), 40))
			prompt := benignSystem + "\n\n" + licence + "\n\n" + code + "\n\n" + question
			path := paths[(i+round)%len(paths)]
			stream := (i+round)%2 == 0
			var body string
			if path == "/v1/chat/completions" || path == "/v1/messages" {
				// The system prompt as its own message, as a real deployment sends it.
				body = fmt.Sprintf(`{"model":"sim","messages":[{"role":"user","content":%q}],"max_tokens":200,"stream":%v}`, prompt, stream)
				if path == "/v1/chat/completions" {
					body = fmt.Sprintf(`{"model":"sim","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":200,"stream":%v}`,
						benignSystem, licence+"\n\n"+code+"\n\n"+question, stream)
				}
			} else {
				body = genBody(path, prompt, 200, stream)
			}
			r := post(t, gw.URL, path, fmt.Sprintf("sk-t%d", i), body)
			text, integrity := replyText(r, path)
			if r.status != 200 || integrity {
				t.Fatalf("tenant t%d %s stream=%v: %d, cut=%v: %.300s", i, path, stream, r.status, integrity, r.body)
			}
			for _, shared := range append(append([]string{benignSystem}, benignLicences...), benignCode...) {
				if quotesRun(text, shared, 40) {
					quotedShared++
					break
				}
			}
		}
	}
	// The replies did quote the shared text (else this test proves nothing).
	if quotedShared < tenants/2 {
		t.Fatalf("only %d of %d replies quoted 40 characters of the shared text", quotedShared, 2*tenants)
	}
	if incs := listIncidents(t, gw.URL); len(incs) != 0 {
		t.Fatalf("%d incidents in a benign run, first: %+v", len(incs), incs[0])
	}
	m := get(t, gw.URL+"/metrics", "admin-key")
	weak := ""
	for _, l := range strings.Split(string(m.body), "\n") {
		if strings.HasPrefix(l, "kvgate_fingerprint_weak_total ") {
			weak = l
		}
	}
	t.Logf("%d of %d replies quoted the shared text; %s", quotedShared, 2*tenants, weak)
}

// quotesRun says text holds some n-byte run of shared (after collapsing white space).
func quotesRun(text, shared string, n int) bool {
	text, shared = strings.Join(strings.Fields(text), " "), strings.Join(strings.Fields(shared), " ")
	for i := 0; i+n <= len(shared); i += n / 2 {
		if strings.Contains(text, shared[i:i+n]) {
			return true
		}
	}
	return false
}
