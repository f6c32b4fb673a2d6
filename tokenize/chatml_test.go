package tokenize

import "testing"

func TestRenderChatML(t *testing.T) {
	cases := []struct {
		name  string
		msgs  []Message
		extra string
		want  string
	}{
		{"no messages", nil, "", "<|im_start|>assistant\n"},
		{
			"system and user",
			[]Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}},
			"",
			"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			"name on the role line",
			[]Message{{Role: "user", Name: "bob", Content: "x"}},
			"",
			"<|im_start|>user name=bob\nx<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			"extra is its own system block before the assistant line",
			[]Message{{Role: "user", Content: "weather?"}},
			`[{"type":"function"}]`,
			"<|im_start|>user\nweather?<|im_end|>\n<|im_start|>system\n[{\"type\":\"function\"}]<|im_end|>\n<|im_start|>assistant\n",
		},
		{
			"empty content still renders the block",
			[]Message{{Role: "assistant", Content: ""}},
			"",
			"<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := RenderChatML(c.msgs, c.extra); got != c.want {
				t.Fatalf("RenderChatML = %q, want %q", got, c.want)
			}
		})
	}
}

// The capacity estimate in RenderChatML must be exact, or Grow either wastes or reallocates.
func TestRenderChatMLAllocatesOnce(t *testing.T) {
	msgs := []Message{{Role: "system", Content: "s"}, {Role: "user", Name: "n", Content: englishText(1, 5000)}}
	allocs := testing.AllocsPerRun(20, func() { _ = RenderChatML(msgs, `{"k":1}`) })
	if allocs != 1 {
		t.Fatalf("RenderChatML allocates %v times, want 1", allocs)
	}
}

func TestByteBoundIsLenAndBoundsCounts(t *testing.T) {
	enc, err := NewEncoder("", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "hello world", "中文", chineseText(2, 3000), goCodeText(2, 3000)} {
		if ByteBound(s) != len(s) {
			t.Fatalf("ByteBound(%d bytes) = %d", len(s), ByteBound(s))
		}
		if n, _ := enc.Count(s, -1); n > ByteBound(s) {
			t.Fatalf("count %d > byte bound %d", n, ByteBound(s))
		}
	}
}
