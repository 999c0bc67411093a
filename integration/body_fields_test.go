package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests {body.<field>}, a field of the request's JSON body, in
// keys and limits (directly and through a map), in a one-liner and in
// later handlers; and that a zone needing no field of the body streams it
// on unread.

// recorder is an upstream that records the bodies it got and answers
// "ok".
type recorder struct {
	url  string // host:port
	mu   sync.Mutex
	got  []string
	hits atomic.Int64
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	u := new(recorder)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, string(b))
		u.mu.Unlock()
		u.hits.Add(1)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	u.url = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// last is the last body the upstream got.
func (u *recorder) last(t *testing.T) string {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.got) == 0 {
		t.Fatal("the upstream got no request")
	}
	return u.got[len(u.got)-1]
}

// bodyFieldsSite is a site whose zone name counts requests to /models by
// user and model, falling back to the user alone, and whose zone
// name_map limits requests to /map by a map of {body.model}; later
// handlers show {body.model}: a response header, /map's answer and the
// access log in accessLog.
func bodyFieldsSite(accessLog, upstream, store, name string) string {
	return fmt.Sprintf(`
`+siteAddr+` {
	log {
		output file %s
		format json
	}
	log_append model {body.model}
	map {body.model} {model_tpm} {
		gpt-4o-mini 3
		default     1
	}
	header >X-Model {body.model}
	header >X-Key {http.rate_limit.key}
	rate_limit {
		%s
		zone %s {
			match {
				path /models
			}
			key {header.X-User}:{body.model} {header.X-User}
			limit 2
			window 1h
		}
		zone %s_map {
			match {
				path /map
			}
			key {header.X-User}
			limit {model_tpm}
			window 1h
		}
	}
	handle /map {
		respond "{body.model} {model_tpm}"
	}
	reverse_proxy %s
}
`, accessLog, store, name, name, upstream)
}

// TestBodyFieldsThroughCaddy: {body.model} in a key counts a user's
// models apart, its spellings of one value (1000, 1e3, "\u0031000") as
// one; a body that gives model twice is refused with 400 naming it, one
// over 1 MiB with 413, and neither reaches the upstream or takes
// anything; a body that is not JSON falls through to the next
// alternative. A limit from a map of {body.model} takes the mapped
// value. Each body reaches the upstream as sent, and later handlers (a
// header, respond, the access log) see {body.model}.
func TestBodyFieldsThroughCaddy(t *testing.T) { testBodyFields(t, "", "body_fields") }

// TestBodyFieldsRedis runs the same on the Redis store.
func TestBodyFieldsRedis(t *testing.T) {
	s := redistest.Standalone(t)
	testBodyFields(t, redisStore("address "+s.URL()), "body_fields_redis")
}

func testBodyFields(t *testing.T, store, zone string) {
	u := newRecorder(t)
	accessLog := filepath.Join(t.TempDir(), "access.log")
	roomInWindow(time.Hour, time.Minute)
	startCaddy(t, bodyFieldsSite(accessLog, u.url, store, zone))
	for i, c := range []struct {
		user, body string
		status     int
		key, model string
	}{
		{"ann", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`, 200, "ann:gpt-4o", "gpt-4o"},
		{"ann", `{"MODEL":"gpt-4o"}`, 200, "ann:gpt-4o", "gpt-4o"},
		{"ann", `{"model":"gpt-4o"}`, 429, "ann:gpt-4o", "gpt-4o"},
		{"ann", `{"model":"gpt-4o-mini"}`, 200, "ann:gpt-4o-mini", "gpt-4o-mini"},
		{"ann", `{"model":1000}`, 200, "ann:1000", "1000"},
		{"ann", `{"model":1e3}`, 200, "ann:1000", "1000"},
		{"ann", `{"model":"\u0031000"}`, 429, "ann:1000", "1000"},
		{"carl", `model=gpt-4o`, 200, "carl", ""},
		{"carl", `{"model":null}`, 200, "carl", ""},
	} {
		resp, _ := request(t, client, http.MethodPost, siteURL+"/models", c.body, "X-User: "+c.user)
		key, model := resp.Header.Get("X-Key"), resp.Header.Get("X-Model")
		if resp.StatusCode != c.status || key != c.key || model != c.model {
			t.Errorf("request %d, %s %s: %d, key %q, {body.model} %q; want %d, %q, %q", i, c.user, c.body, resp.StatusCode, key, model, c.status, c.key, c.model)
		}
		if c.status == 200 {
			if got := u.last(t); got != c.body {
				t.Errorf("request %d: the upstream got %q, want the body as sent", i, got)
			}
		}
	}
	for key, want := range map[string]int64{"ann:gpt-4o": 2, "ann:gpt-4o-mini": 1, "ann:1000": 2, "carl": 2} {
		if used := keyState(t, adminURL, zone, key).Used; used != want {
			t.Errorf("key %s uses %d, want %d", key, used, want)
		}
	}

	hits := u.hits.Load()
	resp, answer := request(t, client, http.MethodPost, siteURL+"/models", `{"model":"gpt-4o","Mod\u0065l":"o3"}`, "X-User: bob")
	var refusal struct {
		Error struct{ Param string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(answer), &refusal)
	if resp.StatusCode != http.StatusBadRequest || refusal.Error.Param != "model" {
		t.Errorf("model twice: %d %s, want 400 naming model", resp.StatusCode, answer)
	}
	big := `{"model":"gpt-4o","pad":"` + strings.Repeat("a", 1<<20) + `"}`
	if resp, _ := request(t, client, http.MethodPost, siteURL+"/models", big, "X-User: bob"); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over 1 MiB: %d, want 413", resp.StatusCode)
	}
	if got := u.hits.Load(); got != hits {
		t.Errorf("the upstream got %d refused requests", got-hits)
	}
	for _, key := range []string{"bob:gpt-4o", "bob:o3", "bob"} {
		if used := keyState(t, adminURL, zone, key).Used; used != 0 {
			t.Errorf("refused requests took %d for %s", used, key)
		}
	}

	for _, c := range []struct{ user, model, limit string }{
		{"m1", "gpt-4o-mini", "3"},
		{"m2", "o3", "1"},
	} {
		body := `{"model":"` + c.model + `"}`
		resp, answer := request(t, client, http.MethodPost, siteURL+"/map", body, "X-User: "+c.user)
		if limit := resp.Header.Get("X-RateLimit-Limit"); resp.StatusCode != 200 || limit != c.limit || answer != c.model+" "+c.limit {
			t.Errorf("/map, %s: %d, limit %s, answer %q; want 200, the map's %s, and respond showing both", c.model, resp.StatusCode, limit, answer, c.limit)
		}
	}

	waitForLog(t, accessLog, 1, `"uri":"/map"`, `"model":"o3"`)
	if lines := logLines(accessLog, `"uri":"/models"`, `"model":"gpt-4o-mini"`); len(lines) != 1 {
		t.Errorf("access log lines of /models with model gpt-4o-mini: %d, want 1", len(lines))
	}
}

// TestBodyFieldInAOneLiner: the one-line form keys on {body.<field>}
// as the block form does, and falls back to the client's address when
// the body does not give it.
func TestBodyFieldInAOneLiner(t *testing.T) {
	startCaddy(t, siteAddr+` {
	rate_limit {body.user} 2r/m
	respond "user={body.user}"
}
`)
	roomInWindow(time.Minute, 5*time.Second)
	for i, c := range []struct {
		body, answer string
		status       int
	}{
		{`{"user":"u1"}`, "user=u1", 200},
		{`{"User":"u1","x":1}`, "user=u1", 200},
		{`{"user":"u1"}`, "", 429},
		{`{"user":"u2"}`, "user=u2", 200},
		{`no json`, "user=", 200},
		{`{}`, "user=", 200},
		{`{"user":null}`, "", 429},
	} {
		resp, answer := request(t, client, http.MethodPost, siteURL+"/", c.body)
		if resp.StatusCode != c.status || c.status == 200 && answer != c.answer {
			t.Errorf("request %d, %s: %d %q, want %d %q", i, c.body, resp.StatusCode, answer, c.status, c.answer)
		}
	}
}

// streamingUpstream is an upstream that tells when the first bytes of a
// request's body arrived, then reads the rest.
type streamingUpstream struct {
	url     string
	started chan struct{}
	read    chan int
}

func newStreamingUpstream(t *testing.T) *streamingUpstream {
	t.Helper()
	u := &streamingUpstream{started: make(chan struct{}, 1), read: make(chan int, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := make([]byte, 1)
		n, _ := io.ReadFull(r.Body, first)
		u.started <- struct{}{}
		rest, _ := io.Copy(io.Discard, r.Body)
		u.read <- n + int(rest)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	u.url = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// TestUploadStreamsThroughAZoneThatReadsNoField: a zone that needs no
// field of the body, nor its bound (reserve <n> with cost_from header
// reads none), passes an upload on as it comes, even in a site whose map
// and access log name {body.model}: the upstream starts reading it
// before the client has sent it all, and a body over 1 MiB goes through.
func TestUploadStreamsThroughAZoneThatReadsNoField(t *testing.T) {
	for _, c := range []struct{ name, zone string }{
		{"plain", "limit 100\n\t\t\twindow 1h"},
		{"reserve", "limit 100000\n\t\t\twindow 1h\n\t\t\tcost_from header X-Cost\n\t\t\treserve 10"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newStreamingUpstream(t)
			startCaddy(t, fmt.Sprintf(`
`+siteAddr+` {
	log {
		output file %s
		format json
	}
	log_append model {body.model}
	map {body.model} {tier} {
		default 1
	}
	rate_limit {
		zone upload_%s {
			key {header.X-User}
			%s
		}
	}
	reverse_proxy %s
}
`, filepath.Join(t.TempDir(), "access.log"), c.name, c.zone, u.url))
			body, w := io.Pipe()
			req, err := http.NewRequest(http.MethodPost, siteURL+"/upload", body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-User", "uploader")
			type answer struct {
				resp *http.Response
				err  error
			}
			answered := make(chan answer, 1)
			go func() {
				resp, err := client.Do(req)
				answered <- answer{resp, err}
			}()
			const part = 256 << 10
			chunk := []byte(`{"model":"gpt-4o","data":"` + strings.Repeat("a", part))
			go w.Write(chunk)
			receive(t, "the upstream to start reading the upload before it is all sent", u.started)
			sent := len(chunk)
			for sent < 2<<20 {
				n, err := w.Write([]byte(strings.Repeat("b", part)))
				if err != nil {
					t.Fatal(err)
				}
				sent += n
			}
			w.Write([]byte(`"}`))
			w.Close()
			sent += 2
			a := receive(t, "the answer", answered)
			if a.err != nil {
				t.Fatal(a.err)
			}
			a.resp.Body.Close()
			if got := receive(t, "the upstream to read the upload", u.read); a.resp.StatusCode != http.StatusOK || got != sent {
				t.Errorf("status %d, the upstream read %d bytes; want 200 and all %d", a.resp.StatusCode, got, sent)
			}
		})
	}
}
