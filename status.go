package ratelimit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Statuses lists response statuses: codes (401) and classes (4xx). In
// JSON it may hold strings and numbers alike.
type Statuses []string

// UnmarshalJSON accepts ["401", 403, "5xx"], or one of them alone.
func (s *Statuses) UnmarshalJSON(b []byte) error {
	if err := (*Alternatives)(s).UnmarshalJSON(b); err != nil {
		return fmt.Errorf("count_status: %w", err)
	}
	return nil
}

// checkCountStatus accepts a status code from 100 to 599, or a class of
// them from 1xx to 5xx.
func checkCountStatus(v string) error {
	if _, err := parseStatusSpec(v); err != nil {
		return err
	}
	return nil
}

// statusSet holds the statuses from 100 to 599 as bits, so that asking
// about a response costs a shift and a mask.
type statusSet [10]uint64

// parseStatusSpec returns the statuses one count_status argument names.
func parseStatusSpec(v string) ([]int, error) {
	if len(v) == 3 && v[1:] == "xx" && v[0] >= '1' && v[0] <= '5' {
		first := int(v[0]-'0') * 100
		codes := make([]int, 100)
		for i := range codes {
			codes[i] = first + i
		}
		return codes, nil
	}
	code, err := strconv.Atoi(v)
	if err != nil || code < 100 || code > 599 {
		return nil, fmt.Errorf("want an HTTP status from 100 to 599 or a class from 1xx to 5xx, got %q", v)
	}
	return []int{code}, nil
}

// newStatusSet returns the set of the statuses specs name; they have been
// checked.
func newStatusSet(specs []string) (statusSet, error) {
	var s statusSet
	for _, v := range specs {
		codes, err := parseStatusSpec(v)
		if err != nil {
			return s, err
		}
		for _, c := range codes {
			s[c/64] |= 1 << (c % 64)
		}
	}
	return s, nil
}

// has reports whether code is in the set.
func (s *statusSet) has(code int) bool {
	return code >= 0 && code < 64*len(s) && s[code/64]&(1<<(code%64)) != 0
}

// statusRecorder passes a response through and records its status, for
// zones that count only some statuses (count_status).
type statusRecorder struct {
	caddyhttp.ResponseWriterWrapper
	// written is the final status written (0 until one is): 1xx
	// statuses other than 101 Switching Protocols are informational, and
	// the final status follows them.
	written int
	// status is the status the response ended with, set by end; 0 if
	// the next handler panicked.
	status int
}

// WriteHeader records the first final status.
func (w *statusRecorder) WriteHeader(code int) {
	if w.written == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.written = code
	}
	w.ResponseWriterWrapper.WriteHeader(code)
}

// Write records the implicit 200 of a body written before any status.
func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.written == 0 {
		w.written = http.StatusOK
	}
	return w.ResponseWriterWrapper.Write(b)
}

// ReadFrom records the implicit 200, as Write does.
func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	if w.written == 0 {
		w.written = http.StatusOK
	}
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// end sets the status the response ended with, once the next handler
// returned err: the status written, if any; else the status an error
// carries (basic_auth fails with one: 401), whether or not the client is
// still there to read it; 499 if the client went away before any answer;
// or the 200 that an empty response gets.
func (w *statusRecorder) end(r *http.Request, err error) {
	carried := 0
	if err != nil {
		carried = carriedStatus(err)
	}
	switch {
	case w.written != 0:
		w.status = w.written
	case carried != 0:
		w.status = carried
	case r.Context().Err() != nil:
		w.status = statusClientClosedRequest
	case err != nil:
		w.status = http.StatusInternalServerError
	default:
		w.status = http.StatusOK
	}
}

// carriedStatus returns the status a handler error carries, or 0. It is
// a function of its own so that the error value errors.As needs is made
// only for a request that ended in an error.
func carriedStatus(err error) int {
	var he caddyhttp.HandlerError
	if errors.As(err, &he) {
		return he.StatusCode
	}
	return 0
}

// final is the status the request counts as: what end recorded, or,
// if the next handler panicked before it could, the status written or
// the 500 Caddy answers a panic with.
func (w *statusRecorder) final() int {
	switch {
	case w.status != 0:
		return w.status
	case w.written != 0:
		return w.written
	}
	return http.StatusInternalServerError
}
