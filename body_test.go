package ratelimit

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/d61b427a/caddy-rate-limit/algorithms/vectors"
)

// serveBody sends a POST with body (its length told) through h, keyed
// by X-Client client, and returns the status (200 when next ran) and
// the body next read.
func serveBody(t *testing.T, h *Handler, client string, body io.Reader, length int64) (status int, got string) {
	t.Helper()
	r, _ := testRequest(t.Context(), http.MethodPost, "192.0.2.1", "X-Client: "+client)
	r.Body, r.ContentLength = io.NopCloser(body), length
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		return nil
	})
	err := h.ServeHTTP(httptest.NewRecorder(), r, next)
	var he caddyhttp.HandlerError
	switch {
	case errors.As(err, &he):
		return he.StatusCode, got
	case err != nil:
		t.Fatal(err)
	}
	return http.StatusOK, got
}

// TestBodyTemplatesReadWithinBounds: a key that reads the body
// ({http.request.body}) reads the one the zone read, within MaxBody: a
// larger body is answered 413 rather than read whole by the
// placeholder, and the next handler reads the body as sent.
func TestBodyTemplatesReadWithinBounds(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_body_key","key":"{http.request.body}","limit":1,"window":"1h"}]}`)
	withClock(t, h, vectors.Start)
	if status, got := serveBody(t, h, "a", strings.NewReader("same"), 4); status != http.StatusOK || got != "same" {
		t.Fatalf("first: %d, next read %q; want 200 and the body", status, got)
	}
	if status, _ := serveBody(t, h, "b", strings.NewReader("same"), 4); status != http.StatusTooManyRequests {
		t.Fatalf("the same body again: %d, want 429 (one key)", status)
	}
	big := strings.Repeat("a", MaxBody+1)
	if status, _ := serveBody(t, h, "a", strings.NewReader(big), -1); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over MaxBody: %d, want 413", status)
	}
}

// unread is a body that fails the test if it is read.
type unread struct{ t *testing.T }

func (u unread) Read([]byte) (int, error) {
	u.t.Error("the body of a banned key was read")
	return 0, io.EOF
}

// TestBannedKeyBodyUnread: a banned key's request to a zone that
// reserves by the body is refused without a read of its body; another
// key's body is read.
func TestBannedKeyBodyUnread(t *testing.T) {
	h := provisionHandler(t, `{"zones":[{"name":"unit_body_ban","key":"{http.request.header.X-Client}","limit":100,"window":"1h",
		"ban":"1h","cost_from":{"usage":"output"},"reserve":{"max_tokens":60}}]}`)
	withClock(t, h, vectors.Start)
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if status, _ := serveBody(t, h, "banned", strings.NewReader(`{}`), 2); status != want {
			t.Fatalf("request %d: %d, want %d", i+1, status, want)
		}
	}
	if status, _ := serveBody(t, h, "banned", unread{t}, 100); status != http.StatusTooManyRequests {
		t.Fatalf("the banned key: %d, want 429", status)
	}
	if status, got := serveBody(t, h, "other", strings.NewReader(`{}`), 2); status != http.StatusOK || got != `{}` {
		t.Fatalf("another key: %d, next read %q; want 200 and the body", status, got)
	}
}
