package discovery

import (
	"context"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// PrimaryStatus is what pgcluster's TXT record at primary.CLUSTER says of
// the cluster's primary (its "state=" string).
type PrimaryStatus string

const (
	// PrimaryUnknown means no state was read: the TXT record is absent (a
	// pgcluster older than it), could not be read, or says something this
	// package does not know. The address answer is used as it is.
	PrimaryUnknown PrimaryStatus = ""
	// PrimaryServing means the address answer names the one serving
	// primary, PrimaryState.Node.
	PrimaryServing PrimaryStatus = "serving"
	// PrimaryHeld means the address answer still names the last primary,
	// PrimaryState.Node, which has left (its check failed) while no
	// successor is seen yet: it is known not to accept connections, and is
	// held in the answer so that clients that cache a negative answer get
	// none.
	PrimaryHeld PrimaryStatus = "held"
	// PrimaryFailOpen means the address answer names the one node that
	// claims to be primary, PrimaryState.Node, although its check fails:
	// pgcluster answers it because every primary of the cluster fails
	// (all_down open), in case the check is what is wrong.
	PrimaryFailOpen PrimaryStatus = "fail_open"
	// PrimaryNone means no serving node claims to be primary: no address.
	PrimaryNone PrimaryStatus = "none"
	// PrimarySplitBrain means PrimaryState.Primaries serving nodes claim
	// to be primary: no address.
	PrimarySplitBrain PrimaryStatus = "split_brain"
)

// PrimaryState is the state of a cluster's primary as pgcluster publishes
// it in TXT at primary.CLUSTER, checked against the address answer it came
// with.
type PrimaryState struct {
	// Status is the state; PrimaryUnknown when none was read.
	Status PrimaryStatus
	// Node is the node named with PrimaryServing, PrimaryHeld and
	// PrimaryFailOpen.
	Node string
	// Primaries is how many nodes claim to be primary with
	// PrimarySplitBrain.
	Primaries int
}

// between reports whether the state is the moment between an old primary
// leaving and a new one being seen: held or none, or the one primary
// failing its check (fail_open), which a connection that proves it accepts
// writes settles as well as DNS can.
func (s PrimaryState) between() bool {
	return s.Status == PrimaryHeld || s.Status == PrimaryNone || s.Status == PrimaryFailOpen
}

// parsePrimaryState reads the TXT records of primary.CLUSTER (see
// readStateRecords) and checks the state against the address answer it came
// with: held, serving and fail_open name an address, none and split_brain
// none. A state that does not match, which a change between the two
// queries can produce, is PrimaryUnknown.
func parsePrimaryState(rrs []dns.RR, addresses int) PrimaryState {
	st := readStateRecords(rrs)
	switch st.Status {
	case PrimaryServing, PrimaryHeld, PrimaryFailOpen:
		if addresses == 0 {
			return PrimaryState{}
		}
	case PrimaryNone, PrimarySplitBrain:
		if addresses != 0 {
			return PrimaryState{}
		}
	}
	return st
}

// readStateRecords reads the TXT records of primary.CLUSTER. Exactly one
// "state=" string must be there, with a known value and, for serving, held
// and fail_open, a "node=" string; anything else is PrimaryUnknown.
func readStateRecords(rrs []dns.RR) PrimaryState {
	var st PrimaryState
	states, nodes := 0, 0
	for _, rr := range rrs {
		txt, ok := rr.(*dns.TXT)
		if !ok {
			continue
		}
		for _, s := range txt.Txt {
			k, v, _ := strings.Cut(s, "=")
			switch k {
			case "state":
				states++
				st.Status = PrimaryStatus(v)
			case "node":
				nodes++
				st.Node = v
			case "primaries":
				st.Primaries, _ = strconv.Atoi(v)
			}
		}
	}
	if states != 1 || nodes > 1 {
		return PrimaryState{}
	}
	switch st.Status {
	case PrimaryServing, PrimaryHeld, PrimaryFailOpen:
		if st.Node == "" {
			return PrimaryState{}
		}
	case PrimaryNone, PrimarySplitBrain:
	default:
		return PrimaryState{}
	}
	return st
}

// primaryTXT asks for the TXT records of name; a failed query is no
// record, so an unreadable state is an unknown one.
func (c *Client) primaryTXT(ctx context.Context, name string) []dns.RR {
	set, err := c.resolver.lookup(ctx, name, dns.TypeTXT)
	if err != nil {
		return nil
	}
	return set.rrs
}
