package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

// TestStatusPageInBrowser loads the admin endpoint's status page in
// headless Chromium from a running Caddy, after a hammering client
// (runaway) got 429s. Once its script has fetched the JSON routes, the
// page shows the zone, runaway as its hottest key with its counts, and the
// load shedder; a zone that limits what responses cost in tokens/units,
// its keys' counts the units they took; a zone priced in money,
// its limit and what its keys took in dollars; a key that is HTML shows
// as text, not markup; and the page fetched again (it refreshes itself).
// A zone whose window is a calendar month shows it with its time zone and
// when the month ends.
func TestStatusPageInBrowser(t *testing.T) {
	integration(t)
	browser := chromium(t)
	site, admin := freePort(), onLoopback(freePort())
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	// A browser's navigation to the admin endpoint carries neither Origin
	// nor Referer; Caddy lets it in only where the empty origin is allowed,
	// as docs/operating.md tells operators to do for the status page.
	globals := caddyGlobals(adminOption(admin, `""`), site, freePort(), jsonLog(logFile, "INFO"))
	siteURL := "http://" + onLoopback(site) + "/"
	startProcess(t, globals+"http://"+onLoopback(site)+` {
	rate_limit {
		# Keys as they are, so that the page shows a key that is HTML.
		log_keys on
		shed backend {
			classes critical normal
			capacity 8
		}
		zone per_client {
			key {header.X-Client}
			limit 5
			window 1h
		}
		# No X-Cost in the answers: each request admitted keeps its
		# reservation, 3 units; one per_client rejects takes nothing.
		zone tokens_per_client {
			key {header.X-Client}
			limit 1000
			window 1h
			cost_from header X-Cost
			reserve 3
		}
		zone monthly {
			key {header.X-Client}
			limit 1000
			window month
			timezone America/New_York
			algorithm fixed_window
		}
		# A GET names no model: the * line prices its reservation, 1000
		# tokens out at $2 a million, $0.002, which each request admitted
		# keeps, no usage answering it.
		zone spend_per_client {
			key {header.X-Client}
			limit $1
			window 1h
			cost_from usage price {
				* input 1.00 output 2.00
			}
			reserve max_tokens 1000
		}
	}
	respond "ok"
}
`, siteURL)

	urls := []string{siteURL}
	if codes := burst(urls, 40, "X-Client: runaway"); codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 35 {
		t.Fatalf("runaway's 40 requests: %v, want 5 allowed and 35 rejected", codes)
	}
	burst(urls, 2, "X-Client: <b>x</b>")
	for _, key := range []string{"alice", "bob"} {
		burst(urls, 1, "X-Client: "+key)
	}

	// Six seconds of the page's virtual time, which Chromium runs at once
	// and stops while a fetch is under way: the first fetches and two
	// refreshes.
	start := time.Now()
	dom := headless(t, browser, "http://"+admin+"/rate_limit/", "--virtual-time-budget=6000", "--dump-dom")
	t.Logf("Chromium rendered the page in %v", time.Since(start).Round(time.Millisecond))
	_, status, _ := strings.Cut(dom, `id="status"`)
	if status, _, _ = strings.Cut(status, "</p>"); !strings.Contains(status, "Updated") {
		t.Fatalf("the page's status line: %s, want Updated\n%s", status, dom)
	}
	_, tokens, _ := strings.Cut(dom, ">tokens_per_client<")
	for _, want := range []string{"1000 tokens/units", ">tokens/units<", ">rejected requests<", ">15<"} {
		if !strings.Contains(tokens, want) {
			t.Errorf("the cost_from zone's card lacks %q", want)
		}
	}
	_, spend, _ := strings.Cut(dom, ">spend_per_client<")
	for _, want := range []string{">$1<", ">dollars<", ">$0.01<", "counted in the dollars they took"} {
		if !strings.Contains(spend, want) {
			t.Errorf("the money zone's card lacks %q", want)
		}
	}
	if spend, _, _ = strings.Cut(spend, ">tokens_per_client<"); strings.Contains(spend, "tokens/units") {
		t.Errorf("the money zone's card counts tokens/units")
	}
	// The zone's key and the alternative each key came from.
	for _, want := range []string{">per_client<", ">backend<", ">40<", ">35<", ">{http.request.header.X-Client} or {http.vars.client_ip}<", ">from {http.request.header.X-Client}<",
		"<dd>month in America/New_York</dd>", "<dt>period ends</dt>"} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if _, rows, _ := strings.Cut(dom, `class="key">`); !strings.HasPrefix(rows, "runaway<") {
		t.Errorf("the first key row is not runaway's")
	}
	if !strings.Contains(dom, ">&lt;b&gt;x&lt;/b&gt;<") || strings.Contains(dom, "<b>x</b>") {
		t.Errorf("the key <b>x</b> is not shown as text")
	}
	if t.Failed() {
		t.Fatalf("rendered page:\n%s", dom)
	}
	// The browser is the only client of GET /rate_limit/zones here.
	if n := len(logLines(logFile, `"received request"`, `"uri":"/rate_limit/zones"`)); n < 2 {
		t.Fatalf("the page fetched /rate_limit/zones %d times, want at least 2: it refreshes itself", n)
	}
}

// TestStatusPageOnASiteInBrowser opens the status page in headless
// Chromium as a person types its address: from the site, behind
// basic_auth with the credentials in the address, and at /ops without
// its trailing slash, with the admin endpoint as Caddy sets it up. Once
// its script has fetched the JSON routes, the page shows both zones, the
// dial, the heaviest key and the load shedder.
func TestStatusPageOnASiteInBrowser(t *testing.T) {
	integration(t)
	browser := chromium(t)
	s := startStatusSite(t)
	for _, address := range []string{strings.Replace(s.site, "http://", "http://ops:secret@", 1) + "/limits/", s.site + "/ops"} {
		dom := headless(t, browser, address, "--virtual-time-budget=3000", "--dump-dom")
		_, status, _ := strings.Cut(dom, `id="status"`)
		if status, _, _ = strings.Cut(status, "</p>"); !strings.Contains(status, "Updated") {
			t.Fatalf("%s: the page's status line: %s, want Updated\n%s", address, status, dom)
		}
		for _, want := range []string{"<h3>api</h3>", "<h3>login</h3>", "<dd>dry_run, until ", "<h3>backend</h3>", `<summary title="` + longIPv6 + `">`, `<summary title="` + longAPIKey + `">`} {
			if !strings.Contains(dom, want) {
				t.Errorf("%s: the rendered page lacks %q", address, want)
			}
		}
		if _, rows, _ := strings.Cut(dom, `class="key">`); !strings.HasPrefix(rows, `<details><summary title="`+longIPv6+`">`) {
			t.Errorf("%s: the first key row is not %s's", address, longIPv6)
		}
		if t.Failed() {
			t.Fatalf("rendered page:\n%s", dom)
		}
	}
}

// TestStatusPageOnAPhone opens the page from the site in Chromium as a
// phone 360 px wide shows it, with the IPv6 address and the API key
// among the top keys and the shedder shedding. The page does not scroll
// sideways, nor does any table in it; each long key is cut in the
// middle, its head cut short yet showing at least as much as its tail,
// its tail whole, and the whole key is its title. A tap opens the key
// whole, without sideways scrolling, and it stays open when the page
// refreshes.
//
// With STATUS_PAGE_SCREENSHOT set to a file, the test also saves the
// page as a phone 390 px wide shows it there: that is how
// docs/status-page.png is made.
func TestStatusPageOnAPhone(t *testing.T) {
	integration(t)
	browser := chromium(t)
	s := startStatusSite(t)
	s.saturate(t)
	page := openDevTools(t, browser, strings.Replace(s.site, "http://", "http://ops:secret@", 1)+"/limits/", 360)
	wait.For(t, "the page to show the shedder shedding", func() bool {
		var shown bool
		// Until the page loads, the tab shows about:blank.
		page.eval(`(document.getElementById("status")?.textContent ?? "").startsWith("Updated") && document.querySelector("#shedders .shedding") !== null`, &shown)
		return shown
	})

	// layout measures what scrolls sideways and how the long keys show: a
	// part of a key is cut if its text is wider than the box that shows it.
	const layout = `(() => {
		const doc = document.documentElement;
		const text = document.createRange();
		const width = e => e.getBoundingClientRect().width;
		const cut = e => { text.selectNodeContents(e); return width(text) > width(e) + 1; };
		return {
			viewport: doc.clientWidth,
			page: doc.scrollWidth,
			tables: [...document.querySelectorAll(".scroll")].map(e => [e.scrollWidth, e.clientWidth]),
			keys: [...document.querySelectorAll("td.key summary")].map(s => {
				const [head, tail] = s.children;
				return {title: s.title, open: s.parentElement.open, headCut: cut(head), tailCut: cut(tail), headShown: width(head), tailShown: width(tail)};
			}),
		};
	})()`
	type keyLayout struct {
		Title                  string
		Open, HeadCut, TailCut bool
		HeadShown, TailShown   float64
	}
	var got struct {
		Viewport, Page int
		Tables         [][2]int
		Keys           []keyLayout
	}
	noSidewaysScroll := func(when string) {
		t.Helper()
		if got.Viewport != 360 || got.Page > got.Viewport {
			t.Errorf("%s: the page is %d px wide in a viewport of %d, want it within 360", when, got.Page, got.Viewport)
		}
		for _, tw := range got.Tables {
			if tw[0] > tw[1] {
				t.Errorf("%s: a table is %d px wide in a box of %d: it scrolls sideways", when, tw[0], tw[1])
			}
		}
	}
	keyOf := func(title string) keyLayout {
		t.Helper()
		for _, k := range got.Keys {
			if k.Title == title {
				return k
			}
		}
		t.Fatalf("no shortened key %s among %+v", title, got.Keys)
		return keyLayout{}
	}

	page.eval(layout, &got)
	noSidewaysScroll("at 360 px")
	for _, key := range []string{longIPv6, longAPIKey} {
		if k := keyOf(key); k.Open || !k.HeadCut || k.TailCut || k.HeadShown < k.TailShown {
			t.Errorf("%s shows as %+v; want its head cut, showing at least as much as its whole tail", key, k)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// A tap on the IPv6 address; then a refresh, which rebuilds the
	// tables: the cards the tap saw are gone.
	page.eval(`(() => {
		document.querySelector('td.key summary[title="`+longIPv6+`"]').click();
		document.getElementById("zones").firstElementChild.dataset.seen = "before the refresh";
		return true;
	})()`, new(bool))
	wait.For(t, "the page to refresh", func() bool {
		var refreshed bool
		page.eval(`document.querySelector("#zones [data-seen]") === null`, &refreshed)
		return refreshed
	})
	page.eval(layout, &got)
	noSidewaysScroll("with a key opened")
	if k := keyOf(longIPv6); !k.Open || k.HeadCut || k.TailCut {
		t.Errorf("%s after a tap and a refresh: %+v, want it open and whole", longIPv6, k)
	}
	if k := keyOf(longAPIKey); k.Open {
		t.Errorf("%s opened with no tap on it", longAPIKey)
	}

	if file := os.Getenv("STATUS_PAGE_SCREENSHOT"); file != "" && !t.Failed() {
		page.eval(`(() => { document.querySelector("details[open] summary").click(); return true; })()`, new(bool))
		page.screenshot(t, file, 390)
		t.Logf("saved the page at 390 px wide in %s", file)
	}
}

// chromium returns the path of a Chromium (or Chrome) binary. Without one
// it skips t, or fails it under CI=true: CI must install one.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH; CI must install it (Debian: apt-get install chromium)")
	}
	t.Skip("no chromium on PATH; install it (Debian: apt-get install chromium) to run the status page's browser test")
	return ""
}

// headless runs the browser headless on url with args (such as
// --dump-dom) and returns what it printed. Its profile is a new empty
// directory; background networking, updates and sync are off, since
// nothing but loopback is reachable, and the sandbox too, since tests may
// run as root.
func headless(t *testing.T, browser, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// Its helper processes may hold stdout open after it exits.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", browser, err, stderr.String())
	}
	return string(out)
}

// devTools is a page in a headless Chromium driven over the DevTools
// protocol on a pipe (--remote-debugging-pipe): commands go to the
// browser's fd 3, answers and events come from its fd 4, each a JSON
// message ended by a NUL byte. It needs no port and no WebSocket.
type devTools struct {
	t       *testing.T
	send    *os.File
	recv    *bufio.Reader
	id      int
	session string // the page's, once attached
}

// openDevTools starts the browser, opens a page as a phone width px wide
// shows it, and loads url in it, as typed in the address bar. The browser
// is stopped when t ends.
func openDevTools(t *testing.T, browser, url string, width int) *devTools {
	t.Helper()
	browserIn, send, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	recv, browserOut, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe")
	cmd.ExtraFiles = []*os.File{browserIn, browserOut} // its fds 3 and 4
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	browserIn.Close()
	browserOut.Close()
	t.Cleanup(func() {
		send.Close() // the browser exits when its pipe closes
		if err := cmd.Wait(); err != nil && t.Failed() {
			t.Logf("%s: %v\n%s", browser, err, stderr.String())
		}
		cancel()
		recv.Close()
	})
	d := &devTools{t: t, send: send, recv: bufio.NewReader(recv)}
	var target struct{ TargetID string }
	d.call("Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var attached struct{ SessionID string }
	d.call("Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached)
	d.session = attached.SessionID
	d.resize(width, 800)
	d.call("Page.navigate", map[string]any{"url": url}, nil)
	return d
}

// call sends a command and decodes its answer's result into result
// (unless nil), skipping the events that come before it.
func (d *devTools) call(method string, params any, result any) {
	d.t.Helper()
	d.id++
	msg := map[string]any{"id": d.id, "method": method, "params": params}
	if d.session != "" {
		msg["sessionId"] = d.session
	}
	b, err := json.Marshal(msg)
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.send.Write(append(b, 0)); err != nil {
		d.t.Fatalf("%s: %v", method, err)
	}
	for {
		b, err := d.recv.ReadBytes(0)
		if err != nil {
			d.t.Fatalf("%s: reading the browser's answer: %v", method, err)
		}
		var answer struct {
			ID     int
			Result json.RawMessage
			Error  *struct{ Message string }
		}
		if err := json.Unmarshal(b[:len(b)-1], &answer); err != nil {
			d.t.Fatalf("%s: %v: %s", method, err, b)
		}
		if answer.ID != d.id {
			continue
		}
		if answer.Error != nil {
			d.t.Fatalf("%s: %s", method, answer.Error.Message)
		}
		if result != nil {
			if err := json.Unmarshal(answer.Result, result); err != nil {
				d.t.Fatalf("%s: %v: %s", method, err, answer.Result)
			}
		}
		return
	}
}

// eval evaluates a JavaScript expression in the page and decodes its
// value into v.
func (d *devTools) eval(expr string, v any) {
	d.t.Helper()
	var out struct {
		Result           struct{ Value json.RawMessage }
		ExceptionDetails *struct {
			Exception struct{ Description string }
		}
	}
	d.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &out)
	if out.ExceptionDetails != nil {
		d.t.Fatalf("%s: %s", expr, out.ExceptionDetails.Exception.Description)
	}
	if err := json.Unmarshal(out.Result.Value, v); err != nil {
		d.t.Fatalf("%s: %v: %s", expr, err, out.Result.Value)
	}
}

// resize makes the page a phone's screen of width by height px.
func (d *devTools) resize(width, height int) {
	d.t.Helper()
	d.call("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": true}, nil)
}

// screenshot saves the whole page, as a phone width px wide shows it, as
// a PNG file.
func (d *devTools) screenshot(t *testing.T, file string, width int) {
	t.Helper()
	d.resize(width, 800)
	var height int
	d.eval(`document.documentElement.scrollHeight`, &height)
	d.resize(width, height)
	var shot struct{ Data []byte }
	d.call("Page.captureScreenshot", map[string]any{"format": "png"}, &shot)
	if err := os.WriteFile(file, shot.Data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestStatusPageZoneNamesInBrowser: zones named with the characters a URL
// gives a meaning to (/, ?, #, %) show on the status page, from a site
// and from the admin endpoint, each with its top keys, beside a zone
// named plainly: the page escapes each name into one segment of the
// address it fetches, and the admin API unescapes it, as it does for
// each zone's other routes. (The names . and .., which no escape keeps
// in a URL's path, are refused at load: see badconfig.) A zone named
// with HTML, and keys that are HTML, short and long, show as text: the
// markup neither renders nor runs. Both the site and the admin endpoint
// send the page with its Content-Security-Policy.
func TestStatusPageZoneNamesInBrowser(t *testing.T) {
	integration(t)
	browser := chromium(t)
	// Were the page to insert them as markup, each would run its
	// onerror (the policy lets no image load), marking the page's body.
	const (
		htmlZone     = "<img src=x onerror=document.body.dataset.zone=1>"
		htmlKey      = "<img src=x onerror=document.body.dataset.key=1>"
		shortHTMLKey = "<svg onload=f()>"
	)
	names := []string{"api", "/", "?", "#", "%", htmlZone}
	var zones strings.Builder
	for _, name := range names {
		fmt.Fprintf(&zones, "\t\t\tzone %q {\n\t\t\t\tkey {header.X-Client}\n\t\t\t\tlimit 5\n\t\t\t\twindow 1h\n\t\t\t}\n", name)
	}
	site, admin := freePort(), onLoopback(freePort())
	siteURL := "http://" + onLoopback(site)
	startProcess(t, caddyGlobals(adminOption(admin, `""`), site, freePort(), "")+siteURL+` {
	handle_path /limits/* {
		rate_limit_status
	}
	handle {
		rate_limit {
			log_keys on
`+zones.String()+`		}
		respond "ok"
	}
}
`, siteURL+"/limits/zones")
	if codes := burst([]string{siteURL + "/"}, 7, "X-Client: seen"); codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 2 {
		t.Fatalf("7 requests: %v, want 5 allowed and 2 rejected", codes)
	}
	for _, key := range []string{htmlKey, shortHTMLKey} {
		if codes := burst([]string{siteURL + "/"}, 1, "X-Client: "+key); codes[http.StatusOK] != 1 {
			t.Fatalf("%s's request: %v, want it allowed", key, codes)
		}
	}
	for _, page := range []string{siteURL + "/limits/", "http://" + admin + "/rate_limit/"} {
		resp, _ := do(t, http.MethodGet, page)
		csp := resp.Header.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'none'", "script-src 'unsafe-inline'", "connect-src 'self'", "frame-ancestors 'none'"} {
			if resp.StatusCode != http.StatusOK || !strings.Contains(csp, d) {
				t.Errorf("GET %s: %d, Content-Security-Policy %q, want 200 with %s", page, resp.StatusCode, csp, d)
			}
		}
	}

	for _, name := range names {
		path := "/rate_limit/zones/" + url.PathEscape(name)
		var top struct{ Zone string }
		if code, body := adminJSON(t, "http://"+admin, http.MethodGet, path+"/top", ""); code != http.StatusOK || json.Unmarshal([]byte(body), &top) != nil || top.Zone != name {
			t.Errorf("GET %s/top: %d %s, want zone %q's top keys", path, code, body, name)
		}
		if code, body := adminJSON(t, "http://"+admin, http.MethodGet, path+"/keys/seen", ""); code != http.StatusOK || !strings.Contains(body, `"used":5`) {
			t.Errorf("GET %s/keys/seen: %d %s, want its 5 used", path, code, body)
		}
	}

	for _, page := range []string{siteURL + "/limits/", "http://" + admin + "/rate_limit/"} {
		dom := headless(t, browser, page, "--virtual-time-budget=3000", "--dump-dom")
		_, status, _ := strings.Cut(dom, `id="status"`)
		if status, _, _ = strings.Cut(status, "</p>"); !strings.Contains(status, "Updated") {
			t.Fatalf("%s: the page's status line: %s, want Updated\n%s", page, status, dom)
		}
		// Cards by their names, as the page shows them: as text, which
		// the browser writes out escaped.
		cards := map[string]string{}
		for _, card := range strings.Split(dom, `<section class="card">`)[1:] {
			name, rest, _ := strings.Cut(strings.TrimPrefix(card, "<h3>"), "</h3>")
			cards[name] = rest
		}
		for _, name := range names {
			if card, ok := cards[asText(name)]; !ok || !strings.Contains(card, `class="key">seen<`) {
				t.Errorf("%s: zone %q's card: %q, want its key seen among its top keys", page, name, card)
			}
		}
		card := cards[asText(htmlZone)]
		if !strings.Contains(card, `class="key">`+asText(shortHTMLKey)+`<`) {
			t.Errorf("%s: the key %s is not shown as text in %q", page, shortHTMLKey, card)
		}
		// A long key is cut in two, its head and its tail.
		head, tail := htmlKey[:len(htmlKey)-8], htmlKey[len(htmlKey)-8:]
		if !strings.Contains(card, `<span class="head">`+asText(head)+`</span><span class="tail">`+asText(tail)+`</span>`) {
			t.Errorf("%s: the key %s is not shown as text in %q", page, htmlKey, card)
		}
		if strings.Contains(dom, "data-zone=") || strings.Contains(dom, "data-key=") {
			t.Errorf("%s: markup of a zone's name or a key ran", page)
		}
		if t.Failed() {
			t.Fatalf("rendered page:\n%s", dom)
		}
	}
}

// asText is text as a browser writes it out in a page's HTML.
func asText(text string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(text)
}
