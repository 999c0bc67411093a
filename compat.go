package ratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/d61b427a/caddy-rate-limit/storage"
	"github.com/d61b427a/caddy-rate-limit/storage/memory"
)

// This file holds what lets a config written for mholt/caddy-ratelimit
// carry over: its handler options (jitter, sweep_interval, log_key,
// disable_metrics), and a refusal that says what to write instead for the
// two it has that this module does not (distributed, storage). log_key,
// distributed and storage are read here, in JSON and in the Caddyfile,
// and kept in no field of the handler: log_key becomes log_keys on.

// migrateToRedis is what the refusal of distributed and storage says.
const migrateToRedis = "want store redis { address ... } instead, which shares exact counters between instances"

// errDistributed and errStorage refuse mholt/caddy-ratelimit's way of
// sharing counts between instances, in one line that says what to write.
var (
	errDistributed = errors.New("distributed: not supported (mholt/caddy-ratelimit's approximate sync through storage); " + migrateToRedis)
	errStorage     = errors.New("storage: not supported (mholt/caddy-ratelimit's sync storage); " + migrateToRedis)
)

// errLogKeyAndLogKeys refuses log_key beside log_keys, which it would
// silently overrule or be overruled by.
var errLogKeyAndLogKeys = errors.New("log_key: want either log_key or log_keys, not both (log_key is log_keys on)")

// UnmarshalJSON reads the handler's JSON config, and the three fields of
// mholt/caddy-ratelimit the handler keeps no field for: log_key, which
// sets log_keys on, and distributed and storage, which are refused with
// what to write instead. Like Caddy, it refuses fields it does not know.
func (h *Handler) UnmarshalJSON(b []byte) error {
	// config is Handler without its methods, so that decoding it does not
	// come back here.
	type config Handler
	var raw struct {
		*config
		LogKey      bool            `json:"log_key"`
		Distributed json.RawMessage `json:"distributed"`
		Storage     json.RawMessage `json:"storage"`
	}
	raw.config = (*config)(h)
	if err := caddy.StrictUnmarshalJSON(b, &raw); err != nil {
		return err
	}
	switch {
	case present(raw.Distributed):
		return errDistributed
	case present(raw.Storage):
		return errStorage
	case raw.LogKey && h.LogKeys != "":
		return errLogKeyAndLogKeys
	case raw.LogKey:
		h.LogKeys = "on"
	}
	return nil
}

// provisionOptions refuses what validateOptions refuses, before anything
// is set up, and applies mholt/caddy-ratelimit's handler options that need
// setting up: the memory store's sweep interval and the jitter's random
// source.
func (h *Handler) provisionOptions(store storage.Store) error {
	if err := h.validateOptions(); err != nil {
		return err
	}
	if sweeper, ok := store.(storage.Sweeper); ok && h.SweepInterval > 0 {
		sweeper.SetSweepInterval(time.Duration(h.SweepInterval))
	}
	if h.Jitter > 0 && h.random == nil {
		h.random = rand.Float64
	}
	return nil
}

// validateOptions checks the handler-level options of mholt/caddy-ratelimit
// and how they sit with this module's own.
func (h *Handler) validateOptions() error {
	if err := checkJitter(h.Jitter); err != nil {
		return fmt.Errorf("jitter: %w", err)
	}
	if err := memory.CheckSweepInterval(time.Duration(h.SweepInterval)); err != nil {
		return fmt.Errorf("sweep_interval: %w", err)
	}
	if h.SweepInterval != 0 {
		if store := configuredStore(h.StoreRaw); store != "memory" {
			return fmt.Errorf("sweep_interval: applies to the memory store only; want it removed with store %s, whose keys expire on their own", store)
		}
	}
	return nil
}

// present reports whether a JSON field was given a value other than null.
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// configuredStore names the store a handler's store config picks: its
// "backend", the key Caddy names a store module by (the inline key of
// StoreRaw).
func configuredStore(raw json.RawMessage) string {
	var s struct {
		Module string `json:"backend"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil || s.Module == "" {
		return "memory"
	}
	return s.Module
}

// unmarshalOption reads one of mholt/caddy-ratelimit's handler-level
// subdirectives; log_key sets log_keys on (unmarshalBlock refuses it
// beside log_keys), and distributed and storage are refused, with what
// to write instead.
func (h *Handler) unmarshalOption(d *caddyfile.Dispenser) error {
	switch dir := d.Val(); dir {
	case "jitter":
		var s string
		if !d.AllArgs(&s) {
			return d.ArgErr()
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return d.Errf("jitter: want a fraction of the wait from 0 to 1 (0.2 adds up to 20%%), got %q", s)
		}
		if err := checkJitter(f); err != nil {
			return d.Errf("jitter: %v", err)
		}
		h.Jitter = f

	case "sweep_interval":
		dur, err := parseDuration(d)
		if err == nil {
			err = memory.CheckSweepInterval(dur)
		}
		if err == nil && dur == 0 {
			err = fmt.Errorf("want a duration of at least %s, got %s", memory.MinSweepInterval, dur)
		}
		if err != nil {
			return d.Errf("sweep_interval: %v", err)
		}
		h.SweepInterval = caddy.Duration(dur)

	case "log_key", "disable_metrics":
		if d.NextArg() {
			return d.ArgErr()
		}
		if dir == "log_key" {
			h.LogKeys = "on"
		} else {
			h.DisableMetrics = true
		}

	case "distributed":
		return d.Err(errDistributed.Error())

	case "storage":
		return d.Err(errStorage.Error())
	}
	return nil
}
