package transport

import "testing"

func TestQueryValue(t *testing.T) {
	for q, want := range map[string]string{
		"timeout=5s":                "5s",
		"a=1&timeout=10s&timeout=1": "10s",
		"timeout":                   "",
		"":                          "",
		"time%6Fut=3s":              "3s",
		"timeout=5%73":              "5s",
		"timeout=%zz":               "",
		"xtimeout=1&timeoutx=2":     "",
	} {
		if got := queryValue(q, "timeout"); got != want {
			t.Errorf("queryValue(%q) = %q, want %q", q, got, want)
		}
	}
}
