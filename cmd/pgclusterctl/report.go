package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/lock"
)

// report is one look at the fleet, as printed (the JSON is for scripts).
type report struct {
	Time     time.Time `json:"time"`
	Registry string    `json:"registry"` // host:port/database
	Zone     string    `json:"zone"`
	// Checks: the fleet's check verdicts were read from Redis. Without
	// them nodes are judged by the registry alone.
	Checks   bool            `json:"checks"`
	Fleet    *fleetReport    `json:"fleet,omitempty"`
	Clusters []clusterReport `json:"clusters"`
	// AllOut says why every node is out, when that is one reason for all.
	AllOut *allOut `json:"all_out,omitempty"`
	// Networks are the client networks of pgcluster_networks, by network:
	// where topology places the clients in each.
	Networks []networkReport `json:"networks,omitempty"`
	// OK: every cluster served has exactly one serving primary, and one
	// cluster at least is served. The exit status is 0 exactly when it holds.
	OK bool `json:"ok"`
}

// networkReport is one row of pgcluster_networks.
type networkReport struct {
	Network string `json:"network"`
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
}

// fleetReport is what Redis says of the fleet.
type fleetReport struct {
	Redis   string   `json:"redis"` // scheme and hosts, never a password
	Prefix  string   `json:"prefix"`
	Members []string `json:"members"` // the live instances' tokens, vetted as the instances vet them
	// Names holds, by token, the host and DNS listener each live instance
	// stored beside its membership (vetted: a name not signed with the
	// secret is not shown).
	Names map[string]string `json:"names,omitempty"`
	// Refused says why each member entry no instance counts was refused
	// (unsigned, wrongly signed, lapsing further ahead than an instance
	// sets).
	Refused []string `json:"refused,omitempty"`
}

type clusterReport struct {
	Name string `json:"name"`
	// Served: the zone has the cluster; not when each of its rows is
	// skipped (then it needs no primary, and the rows_skipped alert says so).
	Served  bool `json:"served"`
	Serving int  `json:"serving"`
	Out     int  `json:"out"`
	// Drained counts the nodes a drain keeps out of the shared names that
	// would serve them; PrimaryDrained names the one primary when a drain
	// holds it (primary. has no address).
	Drained        int    `json:"drained,omitempty"`
	PrimaryDrained string `json:"primary_drained,omitempty"`
	// Unknown counts the nodes the registry allows whose stored check is
	// stale: each instance answers them as its own probe finds them.
	Unknown   int      `json:"unknown,omitempty"`
	Primaries []string `json:"primaries"` // serving nodes claiming to be primary
	// Skipped are its rows that are never served.
	Skipped []skippedRow `json:"skipped,omitempty"`
	// SplitBrain: two or more serving primaries, so primary.<cluster> has
	// no address.
	SplitBrain bool `json:"split_brain"`
	// FailOpen: no node serves, and those the registry allows all fail
	// their checks: all_down open (the default) answers them anyway.
	FailOpen bool         `json:"fail_open"`
	OK       bool         `json:"ok"` // exactly one serving primary, or not served
	Summary  string       `json:"summary"`
	Nodes    []nodeReport `json:"nodes"`
}

// skippedRow is a row never served, as an instance logs and counts it.
type skippedRow struct {
	Reason string `json:"reason"` // the rows_skipped metric's
	Row    string `json:"row"`
	Why    string `json:"why"`
}

type nodeReport struct {
	Name    string `json:"name"`
	Address string `json:"address"` // address:port as the registry has it
	// Region and Zone are where the registry says the node runs.
	Region string `json:"region,omitempty"`
	Zone   string `json:"zone,omitempty"`
	// RegistryRole is the registry's role column, trimmed and in lower
	// case; CheckRole the role the check read (with check postgres).
	RegistryRole string `json:"registry_role"`
	CheckRole    string `json:"check_role,omitempty"`
	// role is the role answered: the check's while it is up, else the
	// registry's (drain's guards count by it).
	role string
	// Registry is the registry's verdict alone: in or out, and why.
	Registry       string `json:"registry"`
	RegistryReason string `json:"registry_reason"`
	// Check is the fleet's check verdict: up, down or unknown; "" when the
	// fleet was not read (no -redis). Its cause and detail while down.
	Check       string     `json:"check,omitempty"`
	CheckCause  string     `json:"check_cause,omitempty"`
	CheckDetail string     `json:"check_detail,omitempty"`
	CheckedAt   *time.Time `json:"checked_at,omitempty"` // the probe's time
	// CheckedBy is the token of the instance whose status this is, and
	// CheckedByLive whether it is a live member of the fleet.
	CheckedBy     string `json:"checked_by,omitempty"`
	CheckedByLive bool   `json:"checked_by_live,omitempty"`
	// StatusError says why the stored status was not used: refused
	// (unsigned, wrongly signed, unreadable, out of Redis's clock's
	// bounds), of another address, or stale (Check is then "stale").
	StatusError string `json:"status_error,omitempty"`
	// LagBytes is how far its replay trails the primary, when known.
	LagBytes *int64 `json:"lag_bytes,omitempty"`
	Lagging  bool   `json:"lagging,omitempty"` // over max_lag: out of standby.
	// SyncState and PrimaryLag: a standby's sync_state and replay_lag as
	// its primary reports them (see sync.), when known.
	SyncState  string `json:"sync_state,omitempty"`
	PrimaryLag string `json:"primary_lag,omitempty"`
	// Lease is the token of the instance holding the node's lease (the
	// one that checks it), LeaseLive whether it is a live member.
	Lease     string `json:"lease,omitempty"`
	LeaseLive bool   `json:"lease_live,omitempty"`
	// LeaseError says why the stored lease counts as none (no TTL, or
	// a TTL no instance sets): the instance the fleet gives the node to
	// takes it over.
	LeaseError string `json:"lease_error,omitempty"`
	// State is in or out, or unknown when the registry allows the node
	// and its stored check is stale (Reason check_stale): the instances
	// then answer it as their own probes find it, which this report
	// cannot tell. Reason is the word an instance shows in TXT and logs;
	// Detail what a person reads.
	State  string `json:"state"`
	Reason string `json:"reason"`
	// Drained is the drain that holds the node, as its TXT says it
	// ("<reason> (until <time>, by <who>, drain <id>)"); "" when none. A
	// drained node serves under its own name alone: State says how its
	// own name answers.
	Drained string `json:"drained,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

func newFleetReport(f *lock.Fleet, o fleetOptions) *fleetReport {
	fr := &fleetReport{Redis: o.redisShown, Prefix: o.prefix, Members: []string{}, Refused: f.Refused}
	for _, m := range f.Members {
		fr.Members = append(fr.Members, m.Token)
		if m.Name != "" {
			if fr.Names == nil {
				fr.Names = map[string]string{}
			}
			fr.Names[m.Token] = m.Name
		}
	}
	return fr
}

func newClusterReport(c pgcluster.ClusterJudgement, f *lock.Fleet) clusterReport {
	cr := clusterReport{Name: c.Name, Serving: c.Serving, Out: c.Out, Drained: c.Drained, Primaries: c.Primaries, Nodes: []nodeReport{}}
	if cr.Primaries == nil {
		cr.Primaries = []string{}
	}
	for _, sk := range c.Skipped {
		cr.Skipped = append(cr.Skipped, skippedRow{Reason: sk.Reason, Row: sk.Row, Why: skipWhy[sk.Reason]})
	}
	allowed := 0 // nodes the registry allows, drained ones aside: what all_down open answers
	drained := map[string]bool{}
	for _, j := range c.Nodes {
		if j.RegistryServing && j.DrainText == "" {
			allowed++
		}
		nr := newNodeReport(j, f)
		if j.DrainText != "" {
			drained[j.Name] = true
		}
		if nr.State == stateUnknown && j.Serving {
			// Judged by the registry alone, it would serve; the
			// instances answer it as their own probes find it.
			if j.DrainText != "" {
				cr.Drained--
			} else {
				cr.Serving--
			}
			cr.Unknown++
			cr.Primaries = slices.DeleteFunc(cr.Primaries, func(p string) bool { return p == j.Name })
		}
		cr.Nodes = append(cr.Nodes, nr)
	}
	cr.Served = c.Serving+c.Out+c.Drained > 0
	cr.SplitBrain = len(cr.Primaries) > 1
	if len(cr.Primaries) == 1 && drained[cr.Primaries[0]] {
		cr.PrimaryDrained = cr.Primaries[0]
	}
	cr.FailOpen = cr.Serving == 0 && cr.Unknown == 0 && allowed > 0
	// A node of unknown state may be a primary, or a second one: the
	// report cannot vouch for the cluster. A drained primary leaves
	// primary. without an address.
	cr.OK = len(cr.Primaries) == 1 && cr.Unknown == 0 && cr.PrimaryDrained == "" || !cr.Served
	cr.Summary = cr.summary()
	return cr
}

func newNodeReport(j pgcluster.Judgement, f *lock.Fleet) nodeReport {
	nr := nodeReport{Name: j.Name, Address: addrText(j.Node), Region: j.Region, Zone: j.Zone, RegistryRole: j.RegistryRole, role: j.Role, Registry: "out"}
	if j.RegistryServing {
		nr.Registry = "in"
	}
	nr.RegistryReason = j.RegistryReason
	nr.State, nr.Reason, nr.Detail = "out", j.Reason, j.Detail
	if j.Serving {
		nr.State = "in"
	}
	nr.Drained = j.DrainText
	if j.Lag >= 0 {
		lag := j.Lag
		nr.LagBytes, nr.Lagging = &lag, j.Lagging
	}
	if j.SyncState != "" {
		nr.SyncState, nr.PrimaryLag = j.SyncState, j.PrimaryLag.String()
		nr.Lagging = j.Lagging
	}
	if f == nil {
		return nr
	}
	v := j.Check
	nr.Check, nr.CheckRole = v.State.String(), v.Role
	if v.State == health.Down {
		nr.CheckCause, nr.CheckDetail = v.Cause, v.Detail
	}
	if !v.Last.IsZero() {
		at := v.Last.UTC()
		nr.CheckedAt = &at
	}
	if strings.HasPrefix(j.Reason, "check_") {
		nr.Detail = v.Detail
	}
	k := f.Keys[j.Cluster+"/"+j.Name]
	nr.Lease, nr.LeaseLive = k.Holder, k.Holder != "" && f.Live(k.Holder)
	if k.LeaseErr != nil {
		nr.LeaseError = k.LeaseErr.Error()
	}
	switch {
	case k.Err != nil:
		// No instance answers from a refused status: each checks the node
		// itself, so pgclusterctl cannot say in or out either.
		nr.Check, nr.CheckRole, nr.CheckCause, nr.CheckDetail = checkStale, "", "", ""
		nr.StatusError = "the stored status is refused: " + k.Err.Error()
		if j.RegistryServing {
			nr.State, nr.Reason = stateUnknown, reasonStale
			nr.Detail = "the stored status is refused (" + k.Err.Error() + "); every instance checks the node itself and answers it as its own probe finds it"
		}
	case k.Status != nil && k.Status.Addr != target(j.Node):
		nr.StatusError = "the stored status is of " + k.Status.Addr.String() + ", not the registry's address"
	case k.Status != nil && k.Stale != "":
		nr.CheckedBy, nr.CheckedByLive = k.Status.Holder, f.Live(k.Status.Holder)
		nr.Check, nr.CheckRole, nr.CheckCause, nr.CheckDetail = checkStale, "", "", ""
		nr.StatusError = "the stored status is stale: " + k.Stale
		if j.RegistryServing {
			nr.State, nr.Reason = stateUnknown, reasonStale
			nr.Detail = k.Stale + "; every instance checks the node itself and answers it as its own probe finds it"
		}
	case k.Status != nil:
		nr.CheckedBy, nr.CheckedByLive = k.Status.Holder, f.Live(k.Status.Holder)
	}
	return nr
}

// A node whose stored status is stale or refused: the check shows
// checkStale, and one the registry allows is of stateUnknown for
// reasonStale, as no instance answers from that status.
const (
	checkStale   = "stale"
	stateUnknown = "unknown"
	reasonStale  = "check_stale"
)

// skipWhy says why a row is skipped, by the rows_skipped metric's reason.
var skipWhy = map[string]string{
	"invalid_name":  "the cluster or node name is not a DNS label (letters, digits, inner hyphens)",
	"reserved_name": "a node named primary, standby, replica or prefer-standby, or a cluster named ns",
	"duplicate":     "another row has this name in another case, and is served instead",
	"name_too_long": "its names would be longer than 255 octets in the zone",
}

func addrText(n pgcluster.Node) string {
	if !n.Address.IsValid() {
		return "-"
	}
	if n.Network.IsValid() {
		return n.Network.String()
	}
	return target(n).String()
}

// placeText is a place as region/zone, "-" for what is unknown.
func placeText(region, zone string) string {
	return dash(region) + "/" + dash(zone)
}

// summary is the cluster's line: serving, primary, split brain.
func (c clusterReport) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d serving, %d out", c.Name, c.Serving, c.Out)
	if c.Drained > 0 {
		fmt.Fprintf(&b, ", %d drained", c.Drained)
	}
	if c.Unknown > 0 {
		fmt.Fprintf(&b, ", %d unknown (stale check: each instance answers as its own probe finds)", c.Unknown)
	}
	if len(c.Skipped) > 0 {
		fmt.Fprintf(&b, ", %d skipped", len(c.Skipped))
	}
	switch {
	case !c.Served:
		b.WriteString("; not served: every row is skipped")
	case c.SplitBrain:
		fmt.Fprintf(&b, "; SPLIT BRAIN: %s claim to be primary, primary.%s has no address", strings.Join(c.Primaries, ", "), c.Name)
	case c.PrimaryDrained != "":
		fmt.Fprintf(&b, "; PRIMARY %s DRAINED: primary.%s has no address", c.PrimaryDrained, c.Name)
	case len(c.Primaries) == 1:
		fmt.Fprintf(&b, "; primary %s", c.Primaries[0])
	case c.Unknown > 0:
		fmt.Fprintf(&b, "; no serving primary known: primary.%s depends on the nodes of unknown state", c.Name)
	default:
		fmt.Fprintf(&b, "; NO SERVING PRIMARY: primary.%s has no address", c.Name)
	}
	if c.FailOpen {
		b.WriteString("; every node the registry allows fails its check: answered anyway under all_down open (the default)")
	}
	return b.String()
}

// exitCode is the exit status the report makes.
func (r *report) exitCode() int {
	if r.OK {
		return exitOK
	}
	return exitNotOK
}

// write prints the report as a table, or as JSON: one line when watching,
// indented otherwise. clearScreen first clears a terminal.
func (r *report) write(w io.Writer, asJSON, watching, clearScreen bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		if !watching {
			enc.SetIndent("", "  ")
		}
		return enc.Encode(r)
	}
	if clearScreen {
		fmt.Fprint(w, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(w, "registry %s, zone %s, at %s\n", r.Registry, r.Zone, r.Time.Format(time.RFC3339))
	if r.Fleet != nil {
		short := make([]string, len(r.Fleet.Members))
		for i, m := range r.Fleet.Members {
			short[i] = shortToken(m)
			if name := r.Fleet.Names[m]; name != "" {
				short[i] += " (" + name + ")"
			}
		}
		fmt.Fprintf(w, "fleet    %s, prefix %s, %d live instances: %s\n", r.Fleet.Redis, r.Fleet.Prefix, len(short), strings.Join(short, ", "))
		if n := len(r.Fleet.Refused); n > 0 {
			fmt.Fprintf(w, "         %d member entries refused, as the instances refuse them (the first: %s)\n", n, r.Fleet.Refused[0])
		}
	} else {
		fmt.Fprintln(w, "fleet    not read (no -redis): nodes judged by the registry alone; the fleet's checks may take more out")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNODE\tADDRESS\tREGION/ZONE\tROLE\tCHECK ROLE\tREGISTRY\tCHECK\tCHECKED BY\tLAG\tLEASE\tSTATE\tREASON")
	for _, c := range r.Clusters {
		for _, n := range c.Nodes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
				c.Name, n.Name, n.Address, placeText(n.Region, n.Zone), dash(n.RegistryRole), dash(n.CheckRole), n.registryText(), n.checkText(),
				member(n.CheckedBy, n.CheckedByLive), n.lagText(), n.leaseText(r.Fleet != nil), n.State, n.reasonText())
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	bad, served := 0, 0
	for _, c := range r.Clusters {
		fmt.Fprintln(w, c.Summary)
		for _, sk := range c.Skipped {
			fmt.Fprintf(w, "  skipped, never served: %s (%s): %s\n", sk.Row, sk.Reason, sk.Why)
		}
		if !c.OK {
			bad++
		}
		if c.Served {
			served++
		}
	}
	for _, n := range r.Networks {
		fmt.Fprintf(w, "network %s: clients in %s\n", n.Network, placeText(n.Region, n.Zone))
	}
	if r.AllOut != nil {
		fmt.Fprintf(w, "every node is out for one reason, %s: %s\n", r.AllOut.Reason, r.AllOut.Hint)
	}
	switch {
	case served == 0:
		fmt.Fprintln(w, "the registry has no node served")
	case bad == 0:
		fmt.Fprintf(w, "every cluster served (%d) has one serving primary\n", served)
	default:
		fmt.Fprintf(w, "%d of %d clusters served without exactly one serving primary\n", bad, served)
	}
	_, err := fmt.Fprintln(w)
	return err
}

func (n nodeReport) registryText() string {
	switch n.Registry {
	case "":
		return "-"
	case "out":
		return "out (" + n.RegistryReason + ")"
	}
	return n.Registry
}

func (n nodeReport) checkText() string {
	switch {
	case n.Check == checkStale:
		return "stale" // why: in REASON
	case n.StatusError != "":
		return "? " + n.StatusError
	case n.Check == "":
		return "-"
	case n.CheckCause != "":
		return n.Check + " (" + n.CheckCause + ")"
	}
	return n.Check
}

func (n nodeReport) lagText() string {
	var s string
	switch {
	case n.LagBytes == nil && n.SyncState == "":
		return "-"
	case n.LagBytes != nil:
		s = strconv.FormatInt(*n.LagBytes, 10)
	}
	if n.SyncState != "" {
		s = strings.TrimSpace(s + " " + n.SyncState + " " + n.PrimaryLag)
	}
	if n.Lagging {
		s += " (over max_lag)"
	}
	return s
}

func (n nodeReport) leaseText(fleet bool) string {
	switch {
	case !fleet:
		return "-"
	case n.LeaseError != "":
		return "none (void)"
	case n.Lease == "":
		return "none"
	}
	return member(n.Lease, n.LeaseLive)
}

func (n nodeReport) reasonText() string {
	text := n.Reason
	if n.Detail != "" {
		text += ": " + n.Detail
	}
	if n.Drained != "" {
		text += "; drained: " + n.Drained
	}
	return text
}

// member shows an instance's token, cut to 8 characters, marked when it is
// not a live member of the fleet.
func member(token string, live bool) string {
	if token == "" {
		return "-"
	}
	if !live {
		return shortToken(token) + " (gone)"
	}
	return shortToken(token)
}

func shortToken(t string) string { return t[:min(len(t), 8)] }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
