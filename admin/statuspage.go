package admin

import (
	_ "embed"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The directive orders itself as Caddy orders metrics, its model: among
// the handlers that answer, after basic_auth and the other middleware a
// site puts in front of it.
func init() {
	caddy.RegisterModule(StatusPage{})
	httpcaddyfile.RegisterHandlerDirective("rate_limit_status", parseStatusPage)
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_status", httpcaddyfile.After, "metrics")
}

// statusPage is the status page: one HTML file, its script and style
// inline, that reads the JSON routes beside it every two seconds. It
// loads nothing from anywhere else, so it works on a machine without
// internet access, and it needs no build step.
//
//go:embed statuspage.html
var statusPage []byte

// statusPageCSP lets the page run its own inline script and style and
// fetch from its own origin, and nothing else: no other script, no frame
// around it (it is no page to embed), no form to submit. The keys it
// shows come from clients, and the page inserts them as text; the policy
// is a second wall should one ever be inserted as markup.
const statusPageCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " +
	"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveStatusPage answers the status page. The page fetches its JSON by
// addresses relative to its own, so the address the browser asked for,
// asked, must end in a slash: without one it is redirected to it. It only
// reads: the page has no control that changes anything.
func serveStatusPage(w http.ResponseWriter, r *http.Request, asked *url.URL) error {
	if err := readOnly(w, r); err != nil {
		return err
	}
	if !strings.HasSuffix(asked.Path, "/") {
		// One leading slash, so that the address stays on this host.
		to := "/" + strings.TrimLeft(asked.EscapedPath(), "/") + "/"
		if asked.RawQuery != "" {
			to += "?" + asked.RawQuery
		}
		http.Redirect(w, r, to, http.StatusPermanentRedirect)
		return nil
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", statusPageCSP)
	_, err := w.Write(statusPage)
	return err
}

// StatusPage serves the rate limiter's status page, the one the admin
// endpoint answers at /rate_limit/, from a site, so that a browser can
// open it: Caddy's admin endpoint refuses a typed or bookmarked address
// unless its origins are loosened. It shows every zone of the running
// config (algorithm, limit, window, store, dial in force), each zone's
// heaviest keys over about the last minute on this instance, and the load
// shedders, refreshed every two seconds. It only reads: it has no route
// that resets a key, sets an override or a dial.
//
// It answers under whatever path it is mounted, prefix stripped or not,
// by the last segments of the request's path:
//
//	.../zones              the running zones, as JSON
//	.../zones/<zone>/top   a zone's heaviest keys (?n= from 1 to 128, default 20)
//	.../shed               the running load shedders
//	anything else          the page, at an address ending in a slash
//
// A path ending in a slash is always the page's.
//
// Keys are shown as the admin endpoint shows them: as hashes in a zone
// whose handler has log_keys off. Put what guards the page in front of
// it (basic_auth, a remote_ip matcher): keys can be credentials.
type StatusPage struct{}

// CaddyModule returns the Caddy module information.
func (StatusPage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_status",
		New: func() caddy.Module { return new(StatusPage) },
	}
}

// ServeHTTP answers the page or its JSON, and never calls next. Errors
// carry their status for handle_errors to shape.
func (StatusPage) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	err := serveSiteStatus(w, r)
	var ae caddy.APIError
	if errors.As(err, &ae) {
		return caddyhttp.Error(ae.HTTPStatus, ae.Err)
	}
	return err
}

// serveSiteStatus routes a request by the last segments of its path, as
// StatusPage's doc lists them, to the admin endpoint's read-only routes.
func serveSiteStatus(w http.ResponseWriter, r *http.Request) error {
	// A path ending in a slash is the page's, even one mounted at
	// /zones/ or /shed/.
	if !strings.HasSuffix(r.URL.Path, "/") {
		parts, err := pathSegments(r.URL.EscapedPath())
		if err != nil {
			return err
		}
		n := len(parts)
		switch {
		case n >= 3 && parts[n-3] == "zones" && parts[n-1] == "top":
			z, err := adminZone(parts[n-2])
			if err != nil {
				return err
			}
			return serveTop(w, r, z)
		case parts[n-1] == "zones":
			return serveZones(w, r)
		case parts[n-1] == "shed":
			return serveShedders(w, r)
		}
	}
	// The browser resolves the page's relative addresses against the
	// address it asked for, before any rewrite (handle_path) stripped it.
	asked := r.URL
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok {
		asked = orig.URL
	}
	return serveStatusPage(w, r, asked)
}

// parseStatusPage sets up the handler from its directive:
//
//	rate_limit_status [<matcher>]
func parseStatusPage(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	s := new(StatusPage)
	return s, s.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile reads the directive, which takes no argument and no
// block (the matcher, if any, has been taken by then).
func (s *StatusPage) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.Errf("rate_limit_status: takes no argument, got %q", d.Val())
	}
	if d.NextBlock(0) {
		return d.Errf("rate_limit_status: takes no block, got %q", d.Val())
	}
	return nil
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*StatusPage)(nil)
	_ caddyfile.Unmarshaler       = (*StatusPage)(nil)
)
