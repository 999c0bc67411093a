package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// TestStatusPage: GET /rate_limit/ (and /rate_limit) answers the status
// page as HTML, under a policy that lets only its own inline script and
// style run and lets it fetch only from its own origin; the page names no
// other host, so it loads nothing from elsewhere and works offline. It is
// read-only: only GET and HEAD are answered.
func TestStatusPage(t *testing.T) {
	a := &adminAPI{}
	for _, path := range []string{"/rate_limit/", "/rate_limit"} {
		w := httptest.NewRecorder()
		if err := a.serve(w, httptest.NewRequest(http.MethodGet, path, nil)); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("GET %s: %d %q, want 200 text/html; charset=utf-8", path, w.Code, w.Header().Get("Content-Type"))
		}
		csp := w.Header().Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'unsafe-inline'", "style-src 'unsafe-inline'", "connect-src 'self'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", path, csp, d)
			}
		}
		page := w.Body.String()
		if !strings.HasPrefix(page, "<!doctype html>") || !strings.Contains(page, `<meta name="viewport"`) {
			t.Fatalf("GET %s: want the HTML page with a viewport, got %.200q", path, page)
		}
		if u := regexp.MustCompile(`(?i)(https?:|["'(])//[^\s"'<>)]*`).FindString(page); u != "" {
			t.Errorf("GET %s: the page refers to another host: %s", path, u)
		}
	}
	err := a.serve(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/rate_limit/", nil))
	if err == nil || !strings.Contains(err.Error(), "POST not allowed") {
		t.Fatalf("POST /rate_limit/: %v, want method not allowed", err)
	}
}
