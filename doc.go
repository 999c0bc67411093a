// Package ratelimit is a Caddy HTTP handler that rejects, or delays, requests
// over a limit before they reach the application, counting them per zone and
// key in memory or in Redis shared by a fleet of Caddy instances.
//
// # Code map
//
// This package is the module and the request path, one concern a file:
//
//   - module.go: the config (Handler, Zone, Window, Statuses, Alternatives),
//     registration, Provision and Cleanup;
//   - validate.go: Validate and the checks the Caddyfile parser runs too;
//   - caddyfile.go: the Caddyfile, block and one-line forms;
//   - compat.go: what carries a mholt/caddy-ratelimit config over;
//   - handler.go: ServeHTTP, the decision, and the end of a request's
//     accounting (finish);
//   - keys.go: key and limit templates resolved per request, and how
//     keys are shown (hashed unless log_keys);
//   - body.go: reading a request's body and its fields, for templates
//     and reservations;
//   - tokens.go: cost_from, costs read from responses, in units or money;
//   - headers.go: the response headers and placeholders;
//   - metrics.go: the metrics and the exceeded event;
//   - adminzone.go: what a zone shows the admin API.
//
// Elsewhere: algorithms decides (pure functions of counts, time, rate and
// cost); storage is the stores' contract, with storage/memory and
// storage/redis the stores and storage/storetest the suite both pass;
// costfrom reads costs and bounds from request and response bodies; admin
// is the admin API, the status page and the caddy rate-limit command;
// shed the load shedder; jwtclaims the JWT placeholders; internal/topkeys
// the top keys; the rest of internal/ small helpers and test support.
//
// # A request's path
//
// Handler.ServeHTTP hands the request to admit, which builds a check for
// each zone that matches it, resolves each zone's key and limit from its
// templates (keys.go), reading the body first if a template or a
// reservation needs it (body.go, costfrom), and asks the store to Take
// every zone's cost at once (decide, with max_delay's waits). A rejected
// request is answered there, with its headers (headers.go), its metrics
// and its event (metrics.go); an allowed one gets its headers and goes on
// to the next handler, its response watched if a zone counts statuses or
// reads costs (tokens.go). Once the response is done, Handler.finish ends
// the request's accounting in the store (Store.Finish): it releases what
// should not count and trues a reservation up to the cost the response
// showed.
package ratelimit
