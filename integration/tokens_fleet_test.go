package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/redistest"
)

// This file tests a token limit kept by a fleet: Caddy processes sharing
// one Redis, each reserving a request's max_tokens at admission and
// truing it up to the output tokens of the response.

// tokenCounter is an upstream that answers OpenAI's Chat Completions in
// JSON, with as many completion tokens as answer says for the request's
// max_tokens, or as its X-Tokens header says, and counts what it
// answered: the requests it got are those the fleet admitted.
type tokenCounter struct {
	url    string // host:port
	answer func(maxTokens int64) int64

	mu       sync.Mutex
	requests int64
	tokens   int64 // completion tokens answered
	excess   int64 // completion tokens answered past the requests' max_tokens
	// excesses are the requests' tokens past their max_tokens, of those
	// answered past them.
	excesses []int64
}

func newTokenCounter(t *testing.T, answer func(maxTokens int64) int64) *tokenCounter {
	t.Helper()
	u := &tokenCounter{answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n, err := strconv.ParseInt(r.Header.Get("X-Tokens"), 10, 64)
		if err != nil {
			n = u.answer(body.MaxTokens)
		}
		u.mu.Lock()
		u.requests++
		u.tokens += n
		if n > body.MaxTokens {
			u.excess += n - body.MaxTokens
			u.excesses = append(u.excesses, n-body.MaxTokens)
		}
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":%d,"total_tokens":%d}}`, n, n+9)
	}))
	t.Cleanup(srv.Close)
	u.url = strings.TrimPrefix(srv.URL, "http://")
	return u
}

// counts are what the upstream answered so far: requests, tokens, and
// tokens past the requests' max_tokens.
func (u *tokenCounter) counts() (requests, tokens, excess int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.requests, u.tokens, u.excess
}

// largestExcesses adds up the n largest excesses answered, what n
// requests at once used past their reservations at most, and tells how
// many requests were answered past them.
func (u *tokenCounter) largestExcesses(n int) (sum int64, over int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e := slices.Clone(u.excesses)
	slices.Sort(e)
	for _, x := range e[max(len(e)-n, 0):] {
		sum += x
	}
	return sum, len(e)
}

// chat sends one chat completion for key asking for maxTokens to url
// through hc, with headers, and returns its status.
func chat(t *testing.T, hc *http.Client, url, key string, maxTokens int64, headers ...string) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":"gpt-4o","max_tokens":%d,"messages":[{"role":"user","content":"Hello"}]}`, maxTokens)
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Client", key)
	setHeaders(req, headers)
	resp, err := hc.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// tokenLimit is the fleet's zone: limit tokenLimit output tokens per
// hour per X-Client, reserving each request's max_tokens.
const tokenLimit = 20000

// Requests of the fleet tests ask for max_tokens from minAsk to maxAsk.
const (
	minAsk = 10
	maxAsk = 200
)

// startTokenFleet starts 3 instances on one Redis with lease as given,
// in front of u, and waits until each counts the others.
func startTokenFleet(t *testing.T, s *redistest.Server, lease string, u *tokenCounter) []instance {
	t.Helper()
	fleet := startFleet(t, 3, fleetSpec{
		store:    "address " + s.URL() + "\nlease " + lease,
		zone:     perClient(tokenLimit) + "\n\t\t\tcost_from usage output\n\t\t\treserve max_tokens 500",
		upstream: u.url,
	})
	waitForFleet(t, fleet)
	return fleet
}

// drainClients is how many clients drainTokens runs at once: no more
// requests than that are ever in flight.
const drainClients = 50

// drainTokens sends chat completions for key from 50 clients at once,
// spread over the fleet, each asking for a random max_tokens until it
// has been refused 3 times in a row, and returns how many were admitted.
func drainTokens(t *testing.T, fleet []instance, key string) int64 {
	t.Helper()
	var mu sync.Mutex
	var admitted int64
	var wg sync.WaitGroup
	for i := range drainClients {
		url := fleet[i%len(fleet)].url
		wg.Go(func() {
			// A transport of its own: closing its idle connections at
			// the end must not break another client's request.
			hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			for refused := 0; refused < 3; {
				switch code := chat(t, hc, url, key, minAsk+rand.Int64N(maxAsk-minAsk+1)); code {
				case http.StatusOK:
					mu.Lock()
					admitted++
					mu.Unlock()
					refused = 0
				case http.StatusTooManyRequests:
					refused++
				default:
					t.Errorf("%s: status %d", url, code)
					return
				}
			}
		})
	}
	wg.Wait()
	return admitted
}

// fleetSum adds a counter series up over the fleet's instances.
func fleetSum(t *testing.T, fleet []instance, series string) int {
	t.Helper()
	n := 0
	for _, in := range fleet {
		n += metricCount(t, in.admin, series)
	}
	return n
}

// TestTokensFleet: three instances on one Redis keep a key's token
// limit between them, with lease off and on. 50 clients at once ask for
// random max_tokens until they are refused, and the upstream answers
// each with at most its max_tokens: the tokens answered to the admitted
// requests add up to no more than the limit, and once every response is
// done (and every lease released) the key's count in Redis is exactly
// their sum.
func TestTokensFleet(t *testing.T) {
	s := redistest.Standalone(t)
	for _, lease := range []string{"off", "on"} {
		t.Run("lease_"+lease, func(t *testing.T) {
			u := newTokenCounter(t, func(maxTokens int64) int64 { return rand.Int64N(maxTokens + 1) })
			fleet := startTokenFleet(t, s, lease, u)
			key := "lease-" + lease
			before := fleetSum(t, fleet, costUnits("fleet", "taken"))
			admitted := drainTokens(t, fleet, key)
			requests, tokens, _ := u.counts()
			t.Logf("admitted %d tokens of %d in %d requests", tokens, tokenLimit, requests)
			if requests != admitted {
				t.Errorf("the upstream got %d requests, %d were admitted", requests, admitted)
			}
			if tokens > tokenLimit {
				t.Errorf("the admitted requests cost %d tokens, past the limit of %d", tokens, tokenLimit)
			}
			waitUsed(t, fleet[0].admin, "fleet", key, tokens)
			if taken := fleetSum(t, fleet, costUnits("fleet", "taken")) - before; taken != int(tokens) {
				t.Errorf("the fleet counts %d tokens taken, the upstream answered %d", taken, tokens)
			}
			if debt := fleetSum(t, fleet, costUnits("fleet", "debt")); debt != 0 {
				t.Errorf("debt %d, but no response cost more than its reservation", debt)
			}
		})
	}
}

// TestTokensFleetDebt: as TestTokensFleet, but the upstream answers
// half of the requests with more tokens than their max_tokens. The
// tokens answered pass the limit by no more than the requests answered
// past their reservations; once the fleet refuses the key, requests that
// each cost 100 for a reservation of 1 go on until one is refused, and
// the key, at or past its limit, refuses the next request everywhere.
func TestTokensFleetDebt(t *testing.T) {
	s := redistest.Standalone(t)
	for _, lease := range []string{"off", "on"} {
		t.Run("lease_"+lease, func(t *testing.T) {
			u := newTokenCounter(t, func(maxTokens int64) int64 {
				if rand.IntN(2) == 0 {
					return maxTokens + 1 + rand.Int64N(maxTokens)
				}
				return rand.Int64N(maxTokens + 1)
			})
			fleet := startTokenFleet(t, s, lease, u)
			key := "debt-" + lease
			before := fleetSum(t, fleet, costUnits("fleet", "taken"))
			admitted := drainTokens(t, fleet, key)
			requests, tokens, excess := u.counts()
			t.Logf("admitted %d tokens of %d in %d requests, %d of them past their reservations", tokens, tokenLimit, requests, excess)
			if requests != admitted {
				t.Errorf("the upstream got %d requests, %d were admitted", requests, admitted)
			}
			if over := tokens - tokenLimit; over > excess {
				t.Errorf("the admitted requests cost %d tokens past the limit, more than the %d they used past their reservations", over, excess)
			}
			// Without leases, the key's count passes its limit only by
			// the debts of the requests in flight when the last request
			// was admitted, at most drainClients of them. (With leases,
			// units counted before the key passed its limit may still be
			// taken after, by requests whose debts add to it.)
			inFlight, overs := u.largestExcesses(drainClients)
			t.Logf("%d requests answered past their reservations, the %d largest excesses add up to %d", overs, drainClients, inFlight)
			if over := tokens - tokenLimit; lease == "off" && over > inFlight {
				t.Errorf("the admitted requests cost %d tokens past the limit, more than the %d that %d requests at once used past their reservations", over, inFlight, drainClients)
			}
			waitUsed(t, fleet[0].admin, "fleet", key, tokens)

			hc := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
			defer hc.CloseIdleConnections()
			tail := 0
			for i := 0; ; i++ {
				code := chat(t, hc, fleet[i%len(fleet)].url, key, 1, "X-Tokens: 100")
				if code == http.StatusTooManyRequests {
					break
				}
				if code != http.StatusOK {
					t.Fatalf("status %d", code)
				}
				tail++
			}
			_, tokens, excess = u.counts()
			waitUsed(t, fleet[0].admin, "fleet", key, tokens)
			if taken := fleetSum(t, fleet, costUnits("fleet", "taken")) - before; taken != int(tokens) {
				t.Errorf("the fleet counts %d tokens taken, the upstream answered %d", taken, tokens)
			}
			t.Logf("then %d requests of 100 tokens for 1: the key holds %d tokens of %d, %d answered past reservations in all, a debt of %d tokens counted by the fleet",
				tail, tokens, tokenLimit, excess, fleetSum(t, fleet, costUnits("fleet", "debt")))
			if tokens < tokenLimit {
				t.Fatalf("the key holds %d tokens, and was refused a reservation of 1 for a limit of %d", tokens, tokenLimit)
			}
			if over := tokens - tokenLimit; over > excess {
				t.Errorf("the key is %d tokens past its limit, more than the %d answered past reservations", over, excess)
			}
			for _, in := range fleet {
				if code := chat(t, hc, in.url, key, 1); code != http.StatusTooManyRequests {
					t.Errorf("%s: status %d for a key in debt, want 429", in.url, code)
				}
			}
		})
	}
}
