package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/d61b427a/caddy-rate-limit/internal/money"
	"github.com/d61b427a/caddy-rate-limit/storage"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "rate-limit",
		Usage: "zones|top|key|reset|override|dial [<zone> [<key>]] [--from <alternative>] [--json] [--address <interface>] [--config <path> [--adapter <name>]]",
		Short: "Shows and changes the rate limits of the running Caddy",
		Long: `
Shows the running rate limit zones, a zone's heaviest keys and a key's
counts, and resets a key, gives it a limit of its own or dials a whole
zone, through the running Caddy's admin API (/rate_limit/). With a store
shared by a fleet (Redis), a change acts on every instance.

  caddy rate-limit zones
  caddy rate-limit top <zone> [--n 20]
  caddy rate-limit key <zone> <key> [--from <alternative>]
  caddy rate-limit reset <zone> <key> [--from <alternative>]
  caddy rate-limit override <zone> <key> <limit> [--ttl 24h] [--from <alternative>]
  caddy rate-limit override <zone> <key> --remove [--from <alternative>]
  caddy rate-limit dial <zone> [--mode enforce|dry_run|off] [--limit <n>] [--ttl 1h]
  caddy rate-limit dial <zone> --remove

A key is its value, as clients send it, or its hash as top shows it.
Each alternative of a zone's key ({header.X-Api-Key}, then the client
address it falls back to) counts apart: top's FROM column says which a
key came from, and --from names it where the key is counted under
several.

--json prints the admin API's answer as it is, for scripts. Keys and
names that hold control characters are printed Go-quoted ("\x1b[2J").

As with 'caddy reload', the admin endpoint is --address if given;
otherwise the one in the config given by --config (and --adapter);
otherwise ` + caddy.DefaultAdminListen + `.`,
		CobraFunc: rateLimitCommands,
	})
}

// rateLimitCommands adds the subcommands of caddy rate-limit and the
// flags they share to cmd.
func rateLimitCommands(cmd *cobra.Command) {
	cmd.PersistentFlags().String("address", "", "Address of the administration API listener (if --config is not used)")
	cmd.PersistentFlags().StringP("config", "c", "", "Configuration file (if --address is not used)")
	cmd.PersistentFlags().StringP("adapter", "a", "", "Name of config adapter to apply (if --config is used)")
	cmd.PersistentFlags().Bool("json", false, "Print the admin API's JSON answer as it is")
	// Without these Cobra answers a mistyped subcommand with the help
	// and exit status 0, which a script would take for success.
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }

	cmd.AddCommand(&cobra.Command{
		Use:   "zones",
		Short: "Lists the running zones",
		Args:  cobra.NoArgs,
		RunE:  run(zonesRequest),
	})

	top := &cobra.Command{
		Use:   "top <zone>",
		Short: "Shows the zone's heaviest keys over about the last minute",
		Args:  cobra.ExactArgs(1),
		RunE:  run(topRequest),
	}
	top.Flags().Int("n", DefaultTopKeys, "How many keys to show")
	cmd.AddCommand(top)

	key := &cobra.Command{
		Use:   "key <zone> <key>",
		Short: "Shows a key's counts, override and ban",
		Args:  cobra.ExactArgs(2),
		RunE:  run(keyRequest),
	}
	fromFlag(key)
	cmd.AddCommand(key)

	reset := &cobra.Command{
		Use:   "reset <zone> <key>",
		Short: "Forgets a key's counts and lifts its ban",
		Args:  cobra.ExactArgs(2),
		RunE:  run(resetRequest),
	}
	fromFlag(reset)
	cmd.AddCommand(reset)

	override := &cobra.Command{
		Use:   "override <zone> <key> (<limit|$amount> [--ttl <duration>] | --remove)",
		Short: "Gives a key a limit of its own, which wins over the zone's",
		Args:  cobra.RangeArgs(2, 3),
		RunE:  run(overrideRequest),
	}
	override.Flags().String("ttl", "", "How long the override lasts (default: until removed)")
	override.Flags().Bool("remove", false, "Remove the key's override")
	fromFlag(override)
	cmd.AddCommand(override)

	dial := &cobra.Command{
		Use:   "dial <zone> ([--mode <mode>] [--limit <n|$amount>] [--ttl <duration>] | --remove)",
		Short: "Sets the zone's mode or its limit for every key without an override",
		Args:  cobra.ExactArgs(1),
		RunE:  run(dialRequest),
	}
	dial.Flags().String("mode", "", "enforce, dry_run or off")
	dial.Flags().String("limit", "", "The limit of every key without an override (dollars, such as $100, for a zone priced in money)")
	dial.Flags().String("ttl", "", "How long the dial lasts (default: until removed)")
	dial.Flags().Bool("remove", false, "Return the zone to its config")
	cmd.AddCommand(dial)
}

// fromFlag adds --from to a subcommand that names a key.
func fromFlag(cmd *cobra.Command) {
	cmd.Flags().String("from", "", "The alternative of the zone's key the key came from, as top shows it (needed only where the key is counted under several)")
}

// adminRequest is what a subcommand asks of the admin endpoint, and how
// it shows the answer to a person.
type adminRequest struct {
	method, path string
	body         any // sent as JSON, if not nil
	show         func(w io.Writer, answer []byte) error
}

// run wraps a subcommand for Cobra, as Caddy wraps its own: it builds the
// subcommand's request from its flags and arguments, sends it, and prints
// the answer, as it is with --json. An error, the endpoint's own message
// if it answered one, is logged and exits 1.
func run(build func(fl caddycmd.Flags, args []string) (adminRequest, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		return caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			req, err := build(fl, args)
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			answer, err := req.send(fl)
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			if fl.Bool("json") {
				_, err = cmd.OutOrStdout().Write(answer)
			} else {
				err = req.show(cmd.OutOrStdout(), answer)
			}
			if err != nil {
				return caddy.ExitCodeFailedStartup, err
			}
			return caddy.ExitCodeSuccess, nil
		})(cmd, args)
	}
}

// send sends req to the admin endpoint the way caddy reload does, and
// returns the answer's body.
func (req adminRequest) send(fl caddycmd.Flags) ([]byte, error) {
	addr, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), nil, fl.String("config"), fl.String("adapter"))
	if err != nil {
		return nil, fmt.Errorf("couldn't determine admin API address: %v", err)
	}
	var body io.Reader
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, req.method, req.path, nil, body)
	if err != nil {
		return nil, endpointError(err)
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// endpointError returns the admin endpoint's own message, if err is an
// answer of its, {"error": "..."}: caddycmd.AdminAPIRequest gives the
// answer's status and body only in its error's text, where the message
// is JSON-escaped. Other errors, such as an endpoint that cannot be
// reached, are returned as they are.
func endpointError(err error) error {
	answer, ok := strings.CutPrefix(err.Error(), "caddy responded with error: HTTP ")
	if !ok {
		return err
	}
	_, body, _ := strings.Cut(answer, ": ")
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
		return err
	}
	return errors.New(e.Error)
}

// zonePath is the admin path of a zone; names and keys are path segments.
func zonePath(zone string) string {
	return "/rate_limit/zones/" + url.PathEscape(zone)
}

// keyPath is the admin path of a key, with the alternative --from names,
// if any; route is "" for the key, "/limit" for its override.
func keyPath(fl caddycmd.Flags, zone, key, route string) string {
	path := zonePath(zone) + "/keys/" + url.PathEscape(key) + route
	if from := fl.String("from"); from != "" {
		path += "?from=" + url.QueryEscape(from)
	}
	return path
}

// keyText is how a subcommand's line names the key it changed: as given,
// and the alternative --from named, if any.
func keyText(fl caddycmd.Flags, key string) string {
	text := fmt.Sprintf("key %q", key)
	if from := fl.String("from"); from != "" {
		text += fmt.Sprintf(" from %q", from)
	}
	return text
}

// ttlFlag returns the --ttl flag, checked here so that a bad one is
// named as the flag. It is sent as written: the endpoint parses it the
// same way.
func ttlFlag(fl caddycmd.Flags) (string, error) {
	ttl := fl.String("ttl")
	if ttl == "" {
		return "", nil
	}
	if d, err := caddy.ParseDuration(ttl); err != nil || d <= 0 {
		return "", fmt.Errorf("--ttl: want a positive duration such as 24h, got %q", ttl)
	}
	return ttl, nil
}

func zonesRequest(caddycmd.Flags, []string) (adminRequest, error) {
	return adminRequest{method: http.MethodGet, path: "/rate_limit/zones", show: showZones}, nil
}

func topRequest(fl caddycmd.Flags, args []string) (adminRequest, error) {
	path := zonePath(args[0]) + "/top?n=" + strconv.Itoa(fl.Int("n"))
	return adminRequest{method: http.MethodGet, path: path, show: showTop}, nil
}

func keyRequest(fl caddycmd.Flags, args []string) (adminRequest, error) {
	return adminRequest{method: http.MethodGet, path: keyPath(fl, args[0], args[1], ""), show: showKey}, nil
}

func resetRequest(fl caddycmd.Flags, args []string) (adminRequest, error) {
	zone, key := args[0], args[1]
	return adminRequest{method: http.MethodDelete, path: keyPath(fl, zone, key, ""), show: func(w io.Writer, _ []byte) error {
		_, err := fmt.Fprintf(w, "zone %q: %s reset\n", zone, keyText(fl, key))
		return err
	}}, nil
}

func overrideRequest(fl caddycmd.Flags, args []string) (adminRequest, error) {
	zone, key := args[0], args[1]
	path := keyPath(fl, zone, key, "/limit")
	if fl.Bool("remove") {
		if len(args) != 2 || fl.Changed("ttl") {
			return adminRequest{}, errors.New("override --remove takes a zone and a key, and no limit or --ttl")
		}
		return adminRequest{method: http.MethodDelete, path: path, show: func(w io.Writer, _ []byte) error {
			_, err := fmt.Fprintf(w, "zone %q: %s: override removed\n", zone, keyText(fl, key))
			return err
		}}, nil
	}
	if len(args) != 3 {
		return adminRequest{}, errors.New("override takes a zone, a key and a limit, or --remove")
	}
	limit, err := limitArg(args[2])
	if err != nil {
		return adminRequest{}, fmt.Errorf("limit: %w", err)
	}
	ttl, err := ttlFlag(fl)
	if err != nil {
		return adminRequest{}, err
	}
	body := struct {
		Limit any    `json:"limit"`
		TTL   string `json:"ttl,omitempty"`
	}{limit, ttl}
	return adminRequest{method: http.MethodPut, path: path, body: body, show: func(w io.Writer, answer []byte) error {
		var o OverrideInfo
		if err := json.Unmarshal(answer, &o); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "zone %q: %s: override %s\n", zone, keyText(fl, key), overrideText(&o.Override, o.Dollars["limit"]))
		return err
	}}, nil
}

// limitArg is a limit as written, as the admin API takes it: an integer
// as a number, dollars ("$75", "0.25"; for a zone priced in money) as
// the string written, which the endpoint reads as the zone counts.
func limitArg(arg string) (any, error) {
	if n, err := strconv.ParseInt(arg, 10, 64); err == nil && n > 0 {
		return n, nil
	}
	if n, err := money.Parse(arg); err == nil && n > 0 {
		return arg, nil
	}
	return nil, fmt.Errorf("want an integer, or dollars such as $75 for a zone priced in money, got %q", arg)
}

func dialRequest(fl caddycmd.Flags, args []string) (adminRequest, error) {
	zone := args[0]
	path := zonePath(zone) + "/dial"
	if fl.Bool("remove") {
		if fl.Changed("mode") || fl.Changed("limit") || fl.Changed("ttl") {
			return adminRequest{}, errors.New("dial --remove takes no --mode, --limit or --ttl")
		}
		return adminRequest{method: http.MethodDelete, path: path, show: func(w io.Writer, _ []byte) error {
			_, err := fmt.Fprintf(w, "zone %q: dial removed\n", zone)
			return err
		}}, nil
	}
	ttl, err := ttlFlag(fl)
	if err != nil {
		return adminRequest{}, err
	}
	var limit any
	// --limit 0 sets no limit, as leaving it out does.
	if v := fl.String("limit"); v != "" && v != "0" {
		if limit, err = limitArg(v); err != nil {
			return adminRequest{}, fmt.Errorf("--limit: %w", err)
		}
	}
	body := struct {
		Mode  string `json:"mode,omitempty"`
		Limit any    `json:"limit,omitempty"`
		TTL   string `json:"ttl,omitempty"`
	}{fl.String("mode"), limit, ttl}
	return adminRequest{method: http.MethodPut, path: path, body: body, show: func(w io.Writer, answer []byte) error {
		var d DialInfo
		if err := json.Unmarshal(answer, &d); err != nil {
			return err
		}
		_, err := fmt.Fprintf(w, "zone %q: dial %s\n", zone, dialText(&d.ZoneDial, d.Dollars["limit"]))
		return err
	}}, nil
}

func showZones(w io.Writer, answer []byte) error {
	var zones []ZoneInfo
	if err := json.Unmarshal(answer, &zones); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tALGORITHM\tLIMIT\tWINDOW\tSTORE\tDIAL\tINSTANCES")
	for _, z := range zones {
		window := z.Window
		if z.Hold != "" {
			window = z.Hold + " hold"
		}
		if z.Timezone != "" {
			window = periodText(z)
		}
		limit := printable(strings.Join(z.Limit, " or "))
		if z.Units && z.Unit != money.Unit {
			limit += " units"
		}
		instances := "-"
		if z.Instances > 0 {
			instances = strconv.Itoa(z.Instances)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			printable(z.Name), z.Algorithm, limit, window, z.Store, dialText(z.Dial, z.Dollars["dial_limit"]), instances)
	}
	return tw.Flush()
}

func showTop(w io.Writer, answer []byte) error {
	var top TopInfo
	if err := json.Unmarshal(answer, &top); err != nil {
		return err
	}
	// A cost_from zone counts the units its keys took; one
	// priced in money, shown in dollars.
	counted, count := "Requests", func(k TopKey) string { return strconv.FormatInt(k.Requests, 10) }
	bound := strconv.FormatInt(top.Error, 10)
	switch {
	case top.Unit == money.Unit:
		counted, count, bound = "Dollars", func(k TopKey) string { return k.Dollars }, top.Dollars["error"]
	case top.Units:
		counted, count = "Units", func(k TopKey) string { return strconv.FormatInt(k.Units, 10) }
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	// FROM last, where a template with a space in it reads whole.
	fmt.Fprintf(tw, "KEY\t%s\tREJECTED\tFROM\n", strings.ToUpper(counted))
	for _, k := range top.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", printable(k.Key), count(k), k.Rejected, printable(k.From))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// A bound of 0 means no key was ever dropped from the summary: the
	// counts are exact.
	accuracy := "the counts are exact"
	if top.Error > 0 {
		accuracy = fmt.Sprintf("each count is at most %s over the truth", bound)
	}
	_, err := fmt.Fprintf(w, "\n%s over about the last minute; %s.\n", counted, accuracy)
	return err
}

func showKey(w io.Writer, answer []byte) error {
	var k KeyInfo
	if err := json.Unmarshal(answer, &k); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "zone\t%s\n", printable(k.Zone))
	fmt.Fprintf(tw, "key\t%s\n", printable(k.Key))
	if k.From != "" {
		fmt.Fprintf(tw, "from\t%s\n", printable(k.From))
	}
	if k.Hash != "" {
		fmt.Fprintf(tw, "hash\t%s\n", k.Hash)
	}
	// An amount of a zone priced in money, in dollars, as the answer
	// gives it.
	amount := func(name string, n int64) string {
		if d, ok := k.Dollars[name]; ok {
			return d
		}
		return strconv.FormatInt(n, 10)
	}
	fmt.Fprintf(tw, "used\t%s\n", amount("used", k.Used))
	fmt.Fprintf(tw, "current\t%s\n", amount("current", k.Current))
	fmt.Fprintf(tw, "previous\t%s\n", amount("previous", k.Previous))
	fmt.Fprintf(tw, "previous_weighted\t%s\n", amount("previous_weighted", k.PreviousWeighted))
	fmt.Fprintf(tw, "reset\t%s\n", timeText(k.Reset))
	fmt.Fprintf(tw, "override\t%s\n", overrideText(k.Override, k.Dollars["override"]))
	fmt.Fprintf(tw, "ban_ends\t%s\n", timeText(k.BanEnds))
	if k.Debt != nil {
		fmt.Fprintf(tw, "debt\t%s\n", amount("debt", *k.Debt))
	}
	if k.Reserved != nil {
		fmt.Fprintf(tw, "reserved\t%s\n", amount("reserved", *k.Reserved))
	}
	return tw.Flush()
}

// printable is s as a table shows it: as it is if every character is
// printable, else Go-quoted ("\x1b[2J", "a\r\nb"), so that a key, which
// clients choose, can neither move the terminal's cursor, clear its
// screen or turn text around, nor forge a row. A string that opens with
// a double quote is quoted too: no string is then shown as another's
// quoted form.
func printable(s string) string {
	if strings.HasPrefix(s, `"`) || !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// overrideText shows an override as "5000 until <time>", or "-" for none;
// its limit as dollars, if given ("$75.00": a zone priced in money).
func overrideText(o *storage.Override, dollars string) string {
	if o == nil {
		return "-"
	}
	limit := strconv.FormatInt(o.Limit, 10)
	if dollars != "" {
		limit = dollars
	}
	return untilText(limit, o.Expires)
}

// dialText shows a dial as "dry_run limit 200 until <time>", or "-" for
// none; its limit as dollars, if given.
func dialText(d *storage.ZoneDial, dollars string) string {
	if d == nil {
		return "-"
	}
	var parts []string
	if d.Mode != "" {
		parts = append(parts, d.Mode)
	}
	switch {
	case dollars != "":
		parts = append(parts, "limit "+dollars)
	case d.Limit > 0:
		parts = append(parts, "limit "+strconv.FormatInt(d.Limit, 10))
	}
	return untilText(strings.Join(parts, " "), d.Expires)
}

func untilText(s string, expires time.Time) string {
	if expires.IsZero() {
		return s
	}
	return s + " until " + timeText(expires)
}

// timeText shows t to the second, in the zone the endpoint gave it in,
// or "-" for the zero time.
// periodText is a calendar period as the zones table shows it: its name,
// its time zone, and when the current period ends, in that zone's own
// time (midnight there), or in UTC if this machine does not know it.
func periodText(z ZoneInfo) string {
	ends := z.PeriodEnds
	if loc, err := time.LoadLocation(z.Timezone); err == nil {
		ends = ends.In(loc)
	}
	return printable(z.Window+" in "+z.Timezone) + ", ends " + timeText(ends)
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}
