package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

// A zone priced in money (cost_from usage price) counts picodollars
// (ZoneInfo.Unit is money.Unit). The routes answer its counts as they are,
// integers a program reads exactly, and beside them the same amounts in
// dollars ("$12.345678"), for a person: in a field Dollars, under the
// JSON names of the counts. They take its overrides and dials in dollars.

// Dollars are amounts of a zone priced in money in dollars, by the JSON
// name of the count each stands for.
type Dollars map[string]string

// priced reports whether the zone counts money.
func (z target) priced() bool {
	return z.info.Unit == money.Unit
}

// inDollars adds to k, a key of a zone priced in money, its amounts in
// dollars.
func (z target) inDollars(k *KeyInfo) {
	if !z.priced() {
		return
	}
	k.Unit = money.Unit
	k.Dollars = Dollars{
		"used": money.Format(k.Used), "current": money.Format(k.Current),
		"previous": money.Format(k.Previous), "previous_weighted": money.Format(k.PreviousWeighted),
	}
	if k.Override != nil {
		k.Dollars["override"] = money.Format(k.Override.Limit)
	}
	if k.Debt != nil {
		k.Dollars["debt"] = money.Format(*k.Debt)
	}
	if k.Reserved != nil {
		k.Dollars["reserved"] = money.Format(*k.Reserved)
	}
}

// OverrideInfo is an override as PUT .../limit answers it: in a zone
// priced in money, with its limit in dollars too.
type OverrideInfo struct {
	storage.Override
	Dollars Dollars `json:"dollars,omitempty"`
}

// DialInfo is a dial as PUT .../dial answers it: in a zone priced in
// money, with its limit in dollars too.
type DialInfo struct {
	storage.ZoneDial
	Dollars Dollars `json:"dollars,omitempty"`
}

// limitDollars is a limit's amount in dollars, in a zone priced in money
// (nil in another, or without a limit).
func (z target) limitDollars(limit int64) Dollars {
	if !z.priced() || limit == 0 {
		return nil
	}
	return Dollars{"limit": money.Format(limit)}
}

// limitOf reads the limit of an override or a dial, raw as the body
// gives it (nil or null when it gives none): in a zone priced in money, dollars,
// as a string with or without its $ ("$75", "0.25") or a number of
// dollars (75), read as picodollars; in another, an integer from 1 to
// maxLimit. Without one, it is 0.
func (z target) limitOf(raw json.RawMessage) (int64, error) {
	if raw == nil || string(raw) == "null" {
		return 0, nil
	}
	if z.priced() {
		text := string(raw)
		if raw[0] == '"' {
			if err := json.Unmarshal(raw, &text); err != nil {
				return 0, apiError(http.StatusBadRequest, fmt.Errorf("limit: %w", err))
			}
		}
		n, err := money.Parse(text)
		if err != nil || n == 0 {
			return 0, apiError(http.StatusBadRequest, fmt.Errorf("limit: want positive dollars, such as \"$75\" or 75, at most %s (zone %q is priced in money), got %s", money.MaxDollars, z.info.Name, raw))
		}
		return n, nil
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	if err != nil || n < 1 || n > maxLimit {
		return 0, apiError(http.StatusBadRequest, fmt.Errorf("limit: want an integer from 1 to %d, got %s", maxLimit, raw))
	}
	return n, nil
}
