package pgcluster

import "testing"

func TestSerialFollowsContent(t *testing.T) {
	p := &PgCluster{}
	pb := publisherFor(p, &settings{zones: []string{testZone}, ttl: 5})
	pb.apply(testNodes(), testAliases)
	first := p.snapshot()
	if first.serial == 0 || first.parts[testZone].names[""].apex.soa.Serial != first.serial {
		t.Fatalf("first serial %d, SOA %v", first.serial, first.parts[testZone].names[""].apex.soa)
	}
	pb.apply(testNodes(), testAliases)
	if s := p.snapshot(); s == first || s.serial != first.serial {
		t.Errorf("same content: a new snapshot with the same serial; got serial %d, want %d", s.serial, first.serial)
	}
	nodes := testNodes()
	nodes[0].Healthy = false
	pb.apply(nodes, testAliases)
	second := p.snapshot().serial
	if second <= first.serial {
		t.Errorf("changed content: serial %d, want more than %d", second, first.serial)
	}
	pb.apply(testNodes(), testAliases)
	if third := p.snapshot().serial; third <= second {
		t.Errorf("serial must keep growing even when content returns to an earlier state: %d after %d", third, second)
	}
}
