package discovery

import (
	"context"

	"github.com/miekg/dns"
)

// polls reports whether the Watcher asks for the primary's state between
// resolutions while v is current: it serves a Pool of primary.CLUSTER and
// the last resolution read a state (a server without the record, an older
// pgcluster, is not asked in vain).
func (w *Watcher) polls(v *view) bool {
	return w.readState && v.state.Status != PrimaryUnknown
}

// stateMoved asks for the primary's state, one TXT query, and reports
// whether it differs from the one the current answer came with: pgcluster
// no longer names that primary (two nodes claim to be primary, another
// node is, or it has left), or names one again. A failed query tells
// nothing: the next resolution reads the state anyway.
func (w *Watcher) stateMoved(ctx context.Context) bool {
	set, err := w.c.resolver.lookup(ctx, w.name, dns.TypeTXT)
	if err != nil {
		return false
	}
	return readStateRecords(set.rrs) != w.view.Load().state
}
