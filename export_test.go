package ratelimit

// The refused configurations and the check of their errors, shared with
// the integration tests (package ratelimit_test), which post them to a
// running Caddy's /load and to the built Caddy's command line.
var (
	BadCaddyfiles = badCaddyfiles
	BadSite       = badSite
	Expand        = expand
	AssertNames   = assertNames
)
