package pgcluster

import (
	"fmt"
	"hash/fnv"
	"net/netip"
)

// placeID numbers a place (a region and a zone) of a placeMap; 0 is the
// unknown place, of clients no network holds and of networks that say
// neither region nor zone.
type placeID int32

// placeMap finds where a client is: the longest network of
// pgcluster_networks that holds its address, and the scope of that
// answer (RFC 7871's SCOPE PREFIX-LENGTH): the shortest prefix around the
// address in which every address is placed alike. It is compiled once per
// change of the networks into one binary trie per family, so that a lookup
// walks at most 32 or 128 bits, whatever the number of networks.
type placeMap struct {
	networks []Network // the networks served, indexed by the trie
	places   []place   // by placeID; places[0] is the unknown place
	netPlace []placeID // each network's place
	v4, v6   []trieNode
	hash     uint64
	skipped  []skipped
}

// place is a region and a zone; "" for what is unknown.
type place struct{ region, zone string }

// trieNode is the prefix of its depth along the bits that lead to it.
type trieNode struct {
	child [2]int32 // 0: none (the root is never a child)
	net   int32    // the network with exactly this prefix, or -1
	// uniform: every address under this prefix is placed as the prefix's
	// own longest match places it (no network below differs).
	uniform bool
}

// newPlaceMap compiles the networks whose region and zone are DNS labels
// (or unknown); the others are skipped, and say why.
func newPlaceMap(networks []Network) *placeMap {
	pm := &placeMap{places: []place{{}}}
	ids := map[place]placeID{{}: 0}
	h := fnv.New64a()
	for _, n := range networks {
		region, zone, ignored := checkPlace(n.Region, n.Zone)
		if ignored != "" || !n.Network.IsValid() {
			pm.skipped = append(pm.skipped, skipped{reason: skipInvalidPlace, what: fmt.Sprintf("network %s: %s", n.Network, ignored)})
			continue
		}
		pl := place{region, zone}
		id, ok := ids[pl]
		if !ok {
			id = placeID(len(pm.places))
			ids[pl] = id
			pm.places = append(pm.places, pl)
		}
		p := n.Network.Masked()
		pm.networks = append(pm.networks, Network{Network: p, Region: region, Zone: zone})
		pm.netPlace = append(pm.netPlace, id)
		fmt.Fprintf(h, "%s %s/%s\n", p, region, zone)
	}
	pm.hash = h.Sum64()
	for i, n := range pm.networks {
		if n.Network.Addr().Is4() {
			pm.v4 = insert(pm.v4, n.Network, int32(i))
		} else {
			pm.v6 = insert(pm.v6, n.Network, int32(i))
		}
	}
	pm.settle(pm.v4, 0, 0)
	pm.settle(pm.v6, 0, 0)
	return pm
}

// insert adds network i at p's prefix, making the nodes on the way.
func insert(nodes []trieNode, p netip.Prefix, i int32) []trieNode {
	if len(nodes) == 0 {
		nodes = append(nodes, trieNode{net: -1})
	}
	a := p.Addr()
	cur := int32(0)
	for d := 0; d < p.Bits(); d++ {
		b := bit(a, d)
		next := nodes[cur].child[b]
		if next == 0 {
			next = int32(len(nodes))
			nodes = append(nodes, trieNode{net: -1})
			nodes[cur].child[b] = next
		}
		cur = next
	}
	nodes[cur].net = i
	return nodes
}

// settle sets each node's uniform flag under node i, whose longest match
// from above places it at eff, and returns the place of node i itself.
func (pm *placeMap) settle(nodes []trieNode, i int32, eff placeID) placeID {
	if len(nodes) == 0 {
		return eff
	}
	n := &nodes[i]
	if n.net >= 0 {
		eff = pm.netPlace[n.net]
	}
	uniform := true
	for _, c := range n.child {
		if c != 0 && (!pm.settleChild(nodes, c, eff) || pm.placeOf(nodes, c, eff) != eff) {
			uniform = false
		}
	}
	nodes[i].uniform = uniform
	return eff
}

// settleChild settles the child c and reports whether it is uniform.
func (pm *placeMap) settleChild(nodes []trieNode, c int32, eff placeID) bool {
	pm.settle(nodes, c, eff)
	return nodes[c].uniform
}

// placeOf is node c's own place given eff from above.
func (pm *placeMap) placeOf(nodes []trieNode, c int32, eff placeID) placeID {
	if n := nodes[c].net; n >= 0 {
		return pm.netPlace[n]
	}
	return eff
}

// bit is address a's bit d, from the most significant.
func bit(a netip.Addr, d int) int {
	if a.Is4() {
		b := a.As4()
		return int(b[d/8]>>(7-d%8)) & 1
	}
	b := a.As16()
	return int(b[d/8]>>(7-d%8)) & 1
}

// lookup places the client a, of whom only the first bits bits count
// (an ECS SOURCE PREFIX-LENGTH; the whole address without ECS): the
// network that places it (-1: none), its place, and the scope, the
// shortest prefix length around a under which every address is placed
// alike (never more than bits; 0 when the family has no network).
func (pm *placeMap) lookup(a netip.Addr, bits int) (network int32, id placeID, scope int) {
	nodes := pm.v6
	if a.Is4() {
		nodes = pm.v4
	}
	network, scope = -1, -1
	if len(nodes) == 0 {
		return -1, 0, 0
	}
	for d, i := 0, int32(0); ; d++ {
		n := &nodes[i]
		if n.net >= 0 {
			network, id = n.net, pm.netPlace[n.net]
		}
		if n.uniform && scope < 0 {
			scope = d
		}
		if d == bits {
			break
		}
		next := n.child[bit(a, d)]
		if next == 0 {
			if scope < 0 {
				scope = d + 1 // no network under a's next bit
			}
			break
		}
		i = next
	}
	if scope < 0 {
		scope = bits
	}
	return network, id, scope
}
