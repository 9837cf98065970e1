package main

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The table of tests/mirror/test_mirror_rewrite.py's with_stream_usage test (hideable=True).
func TestIncludeUsageRuleTable(t *testing.T) {
	cases := []struct {
		body string
		want string // "" : nothing changes
	}{
		{`{"stream": false}`, ""},
		{`{"stream": true, "stream_options": {"include_usage": true}}`, ""},
		{`{"stream": true, "stream_options": "bad"}`, ""},
		{`{"stream": true, "stream_options": {"include_usage": false}}`, `{"stream": true, "stream_options": {"include_usage": true}}`},
		{`{"stream": true, "stream_options": {"include_usage": null}}`, `{"stream": true, "stream_options": {"include_usage": true}}`},
		{`{"stream": true, "stream_options": {"include_usage": false, "continuous_usage_stats": true}}`, ""},
		{`{"stream": true, "stream_options": {}}`, ""},
		{`{"stream": true, "stream_options": {"x": 1}}`, ""},
		// absent: added as the last member, the client's bytes kept
		{`{"model":"m", "stream": true}`, `{"model":"m", "stream": true,"stream_options":{"include_usage":true}}`},
		{"{\"stream\":true}\n", "{\"stream\":true,\"stream_options\":{\"include_usage\":true}}\n"},
		// null is absent for the rule
		{`{"stream":true,"stream_options":null,"n":1}`, `{"stream":true,"stream_options":{"include_usage":true},"n":1}`},
		// falsy values as Python sees them
		{`{"stream":true,"stream_options":{"include_usage":0,"continuous_usage_stats":0}}`, `{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":0}}`},
		{`{"stream":true,"stream_options":{"include_usage":""}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":[]}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":"yes"}}`, ""},
		{`{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":"x"}}`, ""},
		// "stream" must be the JSON true
		{`{"stream": 1}`, ""},
		{`{"stream": "true"}`, ""},
		{`{"prompt": "x"}`, ""},
		// not a JSON object: forwarded unchanged
		{`[{"stream": true}]`, ""},
		{`{"stream": true`, ""},
		{"{\"stream\": true, \"p\": \"\xff\"}", ""},
		{``, ""},
		// the last of a repeated key counts, as for a JSON parser
		{`{"stream": false, "stream": true}`, `{"stream": false, "stream": true,"stream_options":{"include_usage":true}}`},
		{`{"stream": true, "stream": false}`, ""},
		// unicode and escapes are kept as sent
		{`{"prompt":"h\u00e9 <&>","stream":true}`, `{"prompt":"h\u00e9 <&>","stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, c := range cases {
		got := withStreamUsage([]byte(c.body))
		if c.want == "" {
			if got != nil {
				t.Errorf("%q: want unchanged, got %q", c.body, got)
			}
			continue
		}
		if string(got) != c.want {
			t.Errorf("%q: got %q, want %q", c.body, got, c.want)
		}
		var a, b any
		if json.Unmarshal(got, &a) != nil || json.Unmarshal([]byte(c.want), &b) != nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%q: not the JSON wanted", c.body)
		}
	}
}
