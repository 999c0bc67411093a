package admin

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/d61b427a/caddy-rate-limit/storage"
)

const (
	headerAlt   = "{http.request.header.X-Api-Key}"
	clientIPAlt = "{http.vars.client_ip}"
)

// runSpacedZone registers a zone named name whose key is an API key,
// falling back to the client's address: two key spaces.
func runSpacedZone(t *testing.T, name string) *testZone {
	t.Helper()
	z := runZone(t, name, false)
	z.info.Key = []string{headerAlt, clientIPAlt}
	return z
}

// keyAnswer is a key route's answer: the key, or the error's message.
func keyAnswer(t *testing.T, logs *zap.Logger, method, path, body string) (int, KeyInfo, string) {
	t.Helper()
	code, answer := call(t, logs, method, path, body)
	var info KeyInfo
	if code == http.StatusOK && method == http.MethodGet {
		if err := json.Unmarshal([]byte(answer), &info); err != nil {
			t.Fatalf("%s %s: %s: %v", method, path, answer, err)
		}
	}
	return code, info, answer
}

// TestKeyNamedByAlternative: a key is looked up under each alternative of
// its zone's key that could have given it; the one alternative under
// which it holds something is the one shown and changed; under several,
// the request is refused naming them, and from (as listed or in the
// Caddyfile's shorthand) names one; one under none is shown with no use
// and never changed, unless only one alternative could have given it.
func TestKeyNamedByAlternative(t *testing.T) {
	z := runSpacedZone(t, "spaces")
	core, logged := observer.New(zap.InfoLevel)
	logs := zap.New(core)
	const base = "/rate_limit/zones/spaces/keys/"
	const ip = "203.0.113.9" // an API key, and a client's address
	stored := map[string]string{headerAlt: headerAlt + "|" + ip, clientIPAlt: ip}

	z.store.used["spaces/"+stored[headerAlt]] = 2
	if code, k, msg := keyAnswer(t, logs, http.MethodGet, base+ip, ""); code != http.StatusOK || k.From != headerAlt || k.Used != 2 || k.Key != ip {
		t.Fatalf("GET a key held under one alternative: %d %+v %s, want it from %s with 2 used", code, k, msg, headerAlt)
	}

	z.store.used["spaces/"+stored[clientIPAlt]] = 1
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		code, _, msg := keyAnswer(t, logs, method, base+ip, "")
		if code != http.StatusConflict || !strings.Contains(msg, headerAlt+", "+clientIPAlt) || !strings.Contains(msg, "?from=") || !strings.Contains(msg, "--from") {
			t.Fatalf("%s a key held under two alternatives: %d %s, want 409 naming both and how to name one", method, code, msg)
		}
	}
	for _, c := range []struct{ from, want string }{
		{headerAlt, headerAlt},
		{"{header.X-Api-Key}", headerAlt},
		{"{client_ip}", clientIPAlt},
	} {
		code, k, msg := keyAnswer(t, logs, http.MethodGet, base+ip+"?from="+url.QueryEscape(c.from), "")
		if code != http.StatusOK || k.From != c.want || k.Used != z.store.used["spaces/"+stored[c.want]] {
			t.Fatalf("GET with from %s: %d %+v %s, want the key from %s", c.from, code, k, msg, c.want)
		}
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodGet, base+ip+"?from="+url.QueryEscape("{cookie.s}"), ""); code != http.StatusBadRequest ||
		!strings.Contains(msg, "from:") || !strings.Contains(msg, "{cookie.s}") || !strings.Contains(msg, headerAlt) {
		t.Fatalf("GET with an unknown from: %d %s, want 400 naming from, the value and the alternatives", code, msg)
	}

	if code, _, msg := keyAnswer(t, logs, http.MethodDelete, base+ip+"?from="+url.QueryEscape("{client_ip}"), ""); code != http.StatusNoContent {
		t.Fatalf("DELETE with from: %d %s", code, msg)
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodPut, base+ip+"/limit", `{"limit": 5}`); code != http.StatusOK {
		t.Fatalf("PUT limit on the key held under one alternative again: %d %s", code, msg)
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodDelete, base+ip+"/limit", ""); code != http.StatusNoContent {
		t.Fatalf("DELETE limit: %d %s", code, msg)
	}
	want := []string{"reset spaces " + ip, "override spaces " + stored[headerAlt] + " 5", "delete override spaces " + stored[headerAlt]}
	if !slices.Equal(z.store.changes, want) {
		t.Fatalf("the store was asked %q, want %q", z.store.changes, want)
	}
	for _, e := range logged.All() {
		if e.ContextMap()["from"] == "" {
			t.Errorf("%q logged no from: %v", e.Message, e.ContextMap())
		}
	}

	// An address held under no alternative: no use, and nothing changed.
	const unseen = "198.51.100.7"
	if code, k, msg := keyAnswer(t, logs, http.MethodGet, base+unseen, ""); code != http.StatusOK || k.Used != 0 || k.From != "" || k.Hash != "" {
		t.Fatalf("GET an unseen key: %d %+v %s, want no use and no alternative", code, k, msg)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		says               string
	}{
		{http.MethodDelete, base + unseen, "", http.StatusNotFound, "nothing to reset"},
		{http.MethodDelete, base + unseen + "/limit", "", http.StatusNotFound, "nothing to remove"},
		{http.MethodPut, base + unseen + "/limit", `{"limit": 5}`, http.StatusConflict, "?from="},
	} {
		if code, _, msg := keyAnswer(t, logs, c.method, c.path, c.body); code != c.status || !strings.Contains(msg, c.says) {
			t.Errorf("%s %s: %d %s, want %d saying %q", c.method, c.path, code, msg, c.status, c.says)
		}
	}
	if len(z.store.changes) != len(want) {
		t.Fatalf("an unseen key changed the store: %q", z.store.changes[len(want):])
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodPut, base+unseen+"/limit?from="+url.QueryEscape(headerAlt), `{"limit": 5}`); code != http.StatusOK ||
		z.store.changes[len(z.store.changes)-1] != "override spaces "+headerAlt+"|"+unseen+" 5" {
		t.Fatalf("PUT limit on an unseen key with from: %d %s, changes %q", code, msg, z.store.changes)
	}
	// An API key that is no address can only be an API key.
	if code, k, msg := keyAnswer(t, logs, http.MethodGet, base+"customer-42", ""); code != http.StatusOK || k.From != headerAlt || k.Used != 0 {
		t.Fatalf("GET an unseen API key: %d %+v %s, want it from %s", code, k, msg, headerAlt)
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodPut, base+"customer-42/limit", `{"limit": 5}`); code != http.StatusOK ||
		z.store.changes[len(z.store.changes)-1] != "override spaces "+headerAlt+"|customer-42 5" {
		t.Fatalf("PUT limit on an unseen API key: %d %s, changes %q", code, msg, z.store.changes)
	}

	// A zone of the same name in another handler, with an alternative of
	// its own: its keys are asked for too.
	other := runZone(t, "spaces", false)
	other.info.Key = []string{"{http.request.cookie.s}", clientIPAlt}
	other.store = z.store
	if code, k, msg := keyAnswer(t, logs, http.MethodGet, base+ip+"?from="+url.QueryEscape("{cookie.s}"), ""); code != http.StatusOK || k.From != "{http.request.cookie.s}" {
		t.Fatalf("GET from the other handler's alternative: %d %+v %s", code, k, msg)
	}
}

// TestKeyNamedByHash: a key's hash, as top keys show it under log_keys
// off, names that key, found among the zone's top keys, and the answer
// shows the hash, not the key; a hash no top key has is refused, saying
// to pass the key itself, and changes nothing. A long key's bounded form
// ('#' and 32 hex digits) is taken as it is; the long key itself is
// bounded.
func TestKeyNamedByHash(t *testing.T) {
	z := runSpacedZone(t, "hashes")
	logs := zap.NewNop()
	const base = "/rate_limit/zones/hashes/keys/"
	secret := headerAlt + "|secret"
	z.top = []TopKey{{Key: secret, From: headerAlt, Requests: 3}}
	z.store.used["hashes/"+secret] = 3
	hash := z.ShownKey(secret)

	code, k, msg := keyAnswer(t, logs, http.MethodGet, base+url.PathEscape(hash), "")
	if code != http.StatusOK || k.Key != hash || k.From != headerAlt || k.Used != 3 || strings.Contains(msg, "secret") {
		t.Fatalf("GET by hash: %d %s, want the key's counts from %s, shown as its hash", code, msg, headerAlt)
	}
	if code, _, msg := keyAnswer(t, logs, http.MethodDelete, base+url.PathEscape(hash), ""); code != http.StatusNoContent {
		t.Fatalf("DELETE by hash: %d %s", code, msg)
	}
	const unknown = "#0123456789abcdef"
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		if code, _, msg := keyAnswer(t, logs, method, base+url.PathEscape(unknown), ""); code != http.StatusNotFound || !strings.Contains(msg, "pass the key itself") {
			t.Fatalf("%s by a hash no top key has: %d %s, want 404 saying to pass the key itself", method, code, msg)
		}
	}
	if want := []string{"reset hashes " + secret}; !slices.Equal(z.store.changes, want) {
		t.Fatalf("the store was asked %q, want %q", z.store.changes, want)
	}

	long := strings.Repeat("k", storage.MaxKeyLen+1)
	bounded := storage.BoundKey(long)
	z.store.used["hashes/"+headerAlt+"|"+bounded] = 4
	for _, key := range []string{long, bounded} {
		if code, k, msg := keyAnswer(t, logs, http.MethodGet, base+url.PathEscape(key), ""); code != http.StatusOK || k.Used != 4 || k.Key != bounded {
			t.Fatalf("GET %.10s…: %d %s, want the long key's counts, as %s", key, code, msg, bounded)
		}
	}
}
