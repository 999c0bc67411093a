package jwtclaims

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// MaxTokenSize is the longest token considered, in bytes. A longer one is
// ignored before any decoding, so a megabyte header costs no parsing.
const MaxTokenSize = 8 << 10

// PlaceholderPrefix starts every placeholder this package resolves.
const PlaceholderPrefix = "jwt."

// Register makes {jwt.<claim>} placeholders resolvable on repl for request
// r. The token is read and verified only when such a placeholder is first
// asked for, and at most once per request. Every {jwt.*} placeholder is
// known: it is empty if the token did not verify or lacks the claim.
// Caddy asks a replacer's providers in the order they were added, so the
// first Config registered for a request answers for all of them.
func (c *Config) Register(repl *caddy.Replacer, r *http.Request) {
	rc := &requestClaims{config: c, request: r}
	repl.Map(rc.placeholder)
}

// requestClaims resolves one request's {jwt.*} placeholders.
type requestClaims struct {
	config  *Config
	request *http.Request
	once    sync.Once
	claims  map[string]any
}

func (rc *requestClaims) placeholder(key string) (any, bool) {
	path, ok := strings.CutPrefix(key, PlaceholderPrefix)
	if !ok || path == "" {
		return nil, false
	}
	rc.once.Do(func() { rc.claims = rc.config.Claims(rc.request) })
	return Lookup(rc.claims, path), true
}

// Claims returns the claims of r's token if it verified, else nil. The
// returned map is shared and must not be modified.
func (c *Config) Claims(r *http.Request) map[string]any {
	return c.verify(c.token(r))
}

// token returns the raw token of r, or "" if there is none.
func (c *Config) token(r *http.Request) string {
	switch {
	case c.From.Cookie != "":
		ck, err := r.Cookie(c.From.Cookie)
		if err != nil {
			return ""
		}
		return ck.Value
	case c.From.Query != "":
		return r.URL.Query().Get(c.From.Query)
	}
	v := r.Header.Get(c.From.Header)
	if scheme, rest, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(rest)
	}
	if strings.EqualFold(c.From.Header, DefaultHeader) {
		// Another scheme (Basic, say) carries no JWT.
		return ""
	}
	return strings.TrimSpace(v)
}

var errNoKey = errors.New("no key for this algorithm")

// verify returns the claims of token if it verifies, else nil.
func (c *Config) verify(token string) map[string]any {
	if token == "" || len(token) > MaxTokenSize || strings.Count(token, ".") != 2 {
		return nil
	}
	now := c.now()
	var sum [sha256.Size]byte
	if c.cache != nil {
		sum = digest(token)
		if claims, ok := c.cache.get(sum, now); ok {
			return claims
		}
	}
	c.verifications.Add(1)
	claims := jwt.MapClaims{}
	_, err := c.parser.ParseWithClaims(token, claims, c.keyFor)
	if err != nil {
		if ce := c.logger.Check(zap.DebugLevel, "jwt not accepted; {jwt.*} placeholders are empty"); ce != nil {
			ce.Write(zap.Error(err))
		}
		return nil
	}
	if c.cache != nil {
		c.cache.put(sum, claims, c.cacheUntil(claims, now), now)
	}
	return claims
}

func (c *Config) keyFor(t *jwt.Token) (any, error) {
	if k, ok := c.keys[t.Method.Alg()]; ok {
		return k, nil
	}
	return nil, errNoKey
}

// Lookup returns the claim at path, a dotted path for nested claims
// ("org.id"), as placeholder text: strings as they are, numbers without
// exponent, booleans as true or false. Arrays, objects, null and missing
// claims are "". A claim whose own name has a dot is found too.
func Lookup(claims map[string]any, path string) string {
	if v, ok := find(claims, path); ok {
		return render(v)
	}
	return ""
}

func find(m map[string]any, path string) (any, bool) {
	if v, ok := m[path]; ok {
		return v, true
	}
	for i := 0; i < len(path); i++ {
		if path[i] != '.' {
			continue
		}
		if sub, ok := m[path[:i]].(map[string]any); ok {
			if v, ok := find(sub, path[i+1:]); ok {
				return v, true
			}
		}
	}
	return nil, false
}

func render(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return formatNumber(string(v))
	case float64:
		return formatFloat(v)
	case bool:
		return strconv.FormatBool(v)
	}
	return ""
}

// formatNumber renders a JSON number without exponent. Integers keep their
// digits (an id beyond 2^53 stays exact); others go through float64, so
// 1e3 is 1000 and 1.5 stays 1.5 (which no limit accepts).
func formatNumber(s string) string {
	if isInteger(s) {
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return ""
	}
	return formatFloat(f)
}

func formatFloat(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return ""
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
