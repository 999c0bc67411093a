package redistest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// counterName names the counters of key in zone as a rate_limit Redis
// store with key prefix prefix does: <prefix>{<tag>}{<key>}:<zone>, the
// tag the first 4 bytes, as hex, of HMAC-SHA256 of the key with the
// fleet's secret, which the store keeps at <prefix>tag_secret.
func counterName(secret, prefix, zone, key string) (string, error) {
	if secret == "" {
		return "", errors.New("redistest: no secret at " + prefix + "tag_secret: no rate_limit store has reached this Redis")
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(key))
	return prefix + "{" + hex.EncodeToString(mac.Sum(nil)[:4]) + "}{" + key + "}:" + zone, nil
}

// defaultPrefix is a store's default key prefix.
const defaultPrefix = "rl:"

// Counter returns the name of the counters of key in zone on s, of a
// rate_limit store with the default key prefix, which has written its
// secret there.
func (s *Server) Counter(zone, key string) (string, error) {
	return s.CounterIn(0, defaultPrefix, zone, key)
}

// CounterIn is Counter in database db, for a store with key prefix
// prefix.
func (s *Server) CounterIn(db int, prefix, zone, key string) (string, error) {
	secret, err := s.DoIn(db, "GET", prefix+"tag_secret")
	if err != nil {
		return "", err
	}
	return counterName(secret, prefix, zone, key)
}

// Counter returns the name of the counters of key in zone on c, of a
// rate_limit store with the default key prefix, which has written its
// secret there. The secret is read from the node that serves it, whichever
// answers (the others answer MOVED, or are down).
func (c *Cluster) Counter(zone, key string) (string, error) {
	var err error
	for _, n := range append(c.Nodes[:len(c.Nodes):len(c.Nodes)], c.Replicas...) {
		var secret string
		if secret, err = n.Do("GET", defaultPrefix+"tag_secret"); err == nil {
			return counterName(secret, defaultPrefix, zone, key)
		}
	}
	return "", err
}
