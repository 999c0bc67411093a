package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/d61b427a/caddy-rate-limit/internal/wait"
)

func TestMaxDelay(t *testing.T) {
	// The zones of an hour must not turn during the test, or a zone that
	// should refuse a request would let it through.
	roomInWindow(time.Hour, 10*time.Second)
	a := newApp(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	startCaddy(t, withGlobals(fmt.Sprintf(`log {
		output file %s
		format json
		level DEBUG
	}`, logFile))+fmt.Sprintf(`
`+siteAddr+` {
	rate_limit {
		# The log lines are told apart by their keys.
		log_keys on
		zone throttle {
			match {
				not path /bounded /strict /pair /costly
			}
			key throttle
			limit 1
			window 1s
			algorithm fixed_window
			max_delay 3s
			max_waiting 1
		}
		zone bounded {
			match {
				path /bounded
			}
			key bounded
			limit 1
			window 1h
			algorithm fixed_window
			max_delay 2h
			max_waiting 1
		}
		zone strict {
			match {
				path /strict
			}
			key strict
			limit 1
			window 1h
			max_delay 100ms
		}
		zone pair_short {
			match {
				path /pair
			}
			key pair
			limit 1
			window 1s
			algorithm fixed_window
			max_delay 2s
		}
		zone pair_long {
			match {
				path /pair
			}
			key pair
			limit 1
			window 1h
			max_delay 2h
		}
		zone costly {
			match {
				path /costly
			}
			key costly
			limit 10
			window 1h
			cost POST 5
			max_delay 2h
		}
	}
	reverse_proxy %s
}
`, a.url))
	t.Run("waits_until_allowed", func(t *testing.T) {
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		reset, _ := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
		resp, _ = do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		if now := time.Now(); now.Before(time.Unix(reset, 0)) {
			t.Fatalf("delayed request answered at %s, before its window ended at %s", now, time.Unix(reset, 0))
		}
	})
	t.Run("rejects_at_once_beyond_max_delay", func(t *testing.T) {
		resp, _ := do(t, http.MethodGet, siteURL+"/strict")
		status(t, resp, http.StatusOK)
		// A wait for the hour's window to end (seconds at least) is
		// beyond max_delay's 100ms: rejected, and told when to come back.
		resp, _ = do(t, http.MethodGet, siteURL+"/strict")
		status(t, resp, http.StatusTooManyRequests)
		if after, _ := strconv.Atoi(resp.Header.Get("Retry-After")); after < 1 {
			t.Fatalf("Retry-After %q, want a wait in seconds", resp.Header.Get("Retry-After"))
		}
	})
	t.Run("held_only_as_long_as_every_zone_allows", func(t *testing.T) {
		// pair_short would hold a request for up to 2 s, pair_long for up
		// to 2 h. Once both are taken, the request would have to wait for
		// pair_long's hour, which is beyond pair_short's max_delay.
		resp, _ := do(t, http.MethodGet, siteURL+"/pair")
		status(t, resp, http.StatusOK)
		resp, _ = do(t, http.MethodGet, siteURL+"/pair")
		status(t, resp, http.StatusTooManyRequests)
		if n := len(logLines(logFile, "delaying request", `"key":"pair"`)); n != 0 {
			t.Fatalf("the request was held (%d log lines) before its rejection", n)
		}
	})
	t.Run("never_holds_what_can_never_pass", func(t *testing.T) {
		// A POST costs 5; with the zone's limit dialed down to 2, no
		// wait can let it pass: it is answered 413, with no Retry-After.
		if code, body := adminJSON(t, adminURL, http.MethodPut, "/rate_limit/zones/costly/dial", `{"limit":2}`); code != http.StatusOK {
			t.Fatalf("dial: %d %s", code, body)
		}
		resp, _ := do(t, http.MethodPost, siteURL+"/costly")
		status(t, resp, http.StatusRequestEntityTooLarge)
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("Retry-After %q on a request that can never pass", ra)
		}
		if n := len(logLines(logFile, "delaying request", `"key":"costly"`)); n != 0 {
			t.Fatalf("the request was held (%d log lines) before its rejection", n)
		}
	})
	t.Run("disconnect_releases_and_consumes_nothing", func(t *testing.T) {
		// Take this window's slot, then park one request and walk away.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		resp, _ := do(t, http.MethodGet, siteURL+"/")
		status(t, resp, http.StatusOK)
		hits := a.hits.Load()
		if r := giveUp(t, siteURL+"/", 200*time.Millisecond); r.err == nil {
			t.Fatalf("parked request answered before its client gave up: %+v", r)
		}
		// max_waiting is 1: while the walked-away request holds its slot,
		// the next is rejected at once (which takes nothing). Once the
		// server has noticed the disconnect, the slot is free again and a
		// request waits for the next window.
		wait.For(t, "the walked-away request to free its slot", func() bool {
			resp, _ = do(t, http.MethodGet, siteURL+"/")
			return resp.StatusCode != http.StatusTooManyRequests
		})
		status(t, resp, http.StatusOK)
		if got := a.hits.Load() - hits; got != 1 {
			t.Fatalf("app saw %d requests after the disconnect, want 1", got)
		}
		// The abandoned request consumed nothing: the one that waited got
		// the next window's only slot and reports it taken exactly once.
		if used := resp.Header.Get("X-RateLimit-Used"); used != "1" {
			t.Fatalf("used %s in the new window, want 1", used)
		}
	})
	t.Run("waiting_is_bounded", func(t *testing.T) {
		// An hour-long window keeps the parked request parked for as long
		// as the test needs it.
		resp, _ := do(t, http.MethodGet, siteURL+"/bounded")
		status(t, resp, http.StatusOK)
		parked := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteURL+"/bounded", nil)
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("parked request answered %d", resp.StatusCode)
			}
			parked <- err
		}()
		waitForLog(t, logFile, 1, "delaying request", `"zone":"bounded"`)
		// max_waiting is 1 and one request waits: the next is turned away.
		resp, _ = do(t, http.MethodGet, siteURL+"/bounded")
		status(t, resp, http.StatusTooManyRequests)
		cancel()
		if err := <-parked; !errors.Is(err, context.Canceled) {
			t.Fatalf("parked request: %v", err)
		}
		// Its slot is free again once the server has noticed the client
		// went away: then a request waits (until its client gives up)
		// instead of being turned away.
		wait.For(t, "the disconnected request to free its slot", func() bool {
			return giveUp(t, siteURL+"/bounded", 300*time.Millisecond).err != nil // it waited: the slot was free
		})
	})
}
