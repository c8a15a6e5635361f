package pgcluster

import (
	"testing"

	"github.com/coredns/coredns/plugin"
)

// zoneOf finds the zone plugin.Zones.Matches finds, without splitting names.
func TestZoneOf(t *testing.T) {
	p := &PgCluster{Zones: []string{"pgcluster.lan.", "b.example.", "lan2."}}
	root := &PgCluster{Zones: []string{"."}}
	for _, name := range []string{
		"pgcluster.lan.", "x.pgcluster.lan.", "a.b.pgcluster.lan.", "xpgcluster.lan.", "lan.", ".", "b.example.",
		"c.b.example.", "bb.example.", "example.", "x.lan2.", "lan2.", "xlan2.", `x\.pgcluster.lan.`, `a\.b.example.`, `x.y\.lan2.`,
	} {
		if got, want := p.zoneOf(name), plugin.Zones(p.Zones).Matches(name); got != want {
			t.Errorf("zoneOf(%q) = %q, Matches says %q", name, got, want)
		}
		if got, want := root.zoneOf(name), plugin.Zones(root.Zones).Matches(name); got != want {
			t.Errorf("root zone: zoneOf(%q) = %q, Matches says %q", name, got, want)
		}
	}
}
