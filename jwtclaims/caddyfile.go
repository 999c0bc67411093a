package jwtclaims

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// UnmarshalCaddyfile reads a jwt block, the dispenser being on its name:
//
//	jwt {
//		from header|cookie|query <name>   # default: header Authorization (Bearer)
//		secret <secret>                   # e.g. {env.JWT_SECRET}
//		public_key <pem file>             # repeatable
//		algorithms <alg>...
//		issuer <iss>
//		audience <aud>...
//		leeway <duration>
//	}
//
// What can be checked without reading key files is checked here, so that
// `caddy adapt` names the file and line; the rest is checked by Provision.
func (c *Config) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		dir := d.Val()
		switch dir {
		case "from":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("jwt: from: want header|cookie|query <name>, got %q", args)
			}
			switch args[0] {
			case "header":
				c.From = &TokenSource{Header: args[1]}
			case "cookie":
				c.From = &TokenSource{Cookie: args[1]}
			case "query":
				c.From = &TokenSource{Query: args[1]}
			default:
				return d.Errf("jwt: from: unknown source %q (want header, cookie or query)", args[0])
			}

		case "secret":
			if !d.AllArgs(&c.Secret) {
				return d.ArgErr()
			}

		case "public_key":
			var file string
			if !d.AllArgs(&file) {
				return d.ArgErr()
			}
			c.PublicKeys = append(c.PublicKeys, file)

		case "algorithms":
			algs := d.RemainingArgs()
			if len(algs) == 0 {
				return d.ArgErr()
			}
			for _, alg := range algs {
				if err := checkAlgorithm(alg); err != nil {
					return d.Errf("jwt: algorithms: %v", err)
				}
			}
			c.Algorithms = append(c.Algorithms, algs...)

		case "issuer":
			if !d.AllArgs(&c.Issuer) {
				return d.ArgErr()
			}

		case "audience":
			aud := d.RemainingArgs()
			if len(aud) == 0 {
				return d.ArgErr()
			}
			c.Audience = append(c.Audience, aud...)

		case "leeway":
			var s string
			if !d.AllArgs(&s) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(s)
			if err != nil || dur < 0 {
				return d.Errf("jwt: leeway: want a non-negative duration, got %q", s)
			}
			c.Leeway = caddy.Duration(dur)

		default:
			return d.Errf("jwt: unknown subdirective %q (want from, secret, public_key, algorithms, issuer, audience or leeway)", dir)
		}
	}
	if c.Secret == "" && len(c.PublicKeys) == 0 {
		return d.Err("jwt: no key: want secret or public_key")
	}
	return nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Config)(nil)
