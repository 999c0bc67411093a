package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestTopKeysThroughCaddy: after traffic from many clients and a hammering
// one, the admin API names the hammering client first, with its requests
// and rejections; ?n bounds the answer and a bad n is refused; by
// default the keys are their hashes, never the keys.
func TestTopKeysThroughCaddy(t *testing.T) {
	startCaddy(t, `
`+siteAddr+` {
	rate_limit {
		log_keys on
		zone top_open {
			key {header.X-Client}
			limit 5
			window 1h
		}
	}
	respond "ok"
}
`+site2Addr+` {
	rate_limit {
		zone top_hidden {
			key {header.X-Client}
			limit 5
			window 1h
		}
	}
	respond "ok"
}
`)
	for i := range 30 {
		get(t, siteURL+"/", fmt.Sprint("client-", i))
	}
	for range 40 {
		get(t, siteURL+"/", "runaway")
	}
	a := topKeys(t, "top_open", "?n=3")
	if len(a.Keys) != 3 || a.Keys[0].Key != "runaway" || a.Keys[0].Requests != 40 || a.Keys[0].Rejected != 35 {
		t.Fatalf("top 3: %+v, want runaway first with 40 requests, 35 rejected", a)
	}
	if len(topKeys(t, "top_open", "").Keys) != 20 {
		t.Fatal("without n, want the top 20")
	}
	if code, body := adminJSON(t, adminURL, http.MethodGet, "/rate_limit/zones/top_open/top?n=0", ""); code != http.StatusBadRequest || !strings.Contains(body, "n:") {
		t.Fatalf("n=0: %d %s, want 400 naming n", code, body)
	}
	for range 7 {
		get(t, site2URL+"/", "runaway")
	}
	h, hash := topKeys(t, "top_hidden", ""), keyHash(t, adminURL, "top_hidden", "runaway")
	if len(h.Keys) != 1 || h.Keys[0].Key != hash || h.Keys[0].Rejected != 2 {
		t.Fatalf("by default: %+v, want the key as its hash %s, 2 rejected", h, hash)
	}
	if _, body := adminJSON(t, adminURL, http.MethodGet, "/rate_limit/zones/top_hidden/top", ""); strings.Contains(body, "runaway") {
		t.Fatalf("by default, top keys show the key: %s", body)
	}
}
