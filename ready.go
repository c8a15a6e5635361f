package pgcluster

// Ready implements the ready.Readiness interface: true once the registry has
// been loaded.
func (p *PgCluster) Ready() bool { return p.snapshot() != nil }
