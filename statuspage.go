package ratelimit

import (
	_ "embed"
	"net/http"
)

// statusPage is the page GET /rate_limit/ answers: one HTML file, its
// script and style inline, that reads this admin endpoint's JSON routes
// every two seconds. It loads nothing from anywhere else, so it works on
// a machine without internet access, and it needs no build step.
//
//go:embed statuspage.html
var statusPage []byte

// statusPageCSP lets the page run its own inline script and style and
// fetch from its own origin, and nothing else: no other script, no frame
// around it (the admin endpoint is no page to embed), no form to submit.
// The keys it shows come from clients, and the page inserts them as text;
// the policy is a second wall should one ever be inserted as markup.
const statusPageCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " +
	"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveStatusPage answers GET /rate_limit/ with the status page. It only
// reads: the page has no control that changes anything.
func serveStatusPage(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(r)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", statusPageCSP)
	_, err := w.Write(statusPage)
	return err
}
