package lock

// owner is the member that should hold key's lease: the highest score of
// rendezvous hashing, so that keys spread evenly and a member's coming or
// going moves only its share.
func owner(members []string, key string) string {
	return newRanking(members).owner(key)
}

// FNV-1a, 64 bits (hash/fnv's New64a), inlined so that a key's score
// against each member continues from the member's own state.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// ranking is a list of members ready for rendezvous hashing: a key's score
// against a member is FNV-1a of the member's token, a zero byte and the
// key; each member's state after its token and the zero byte is computed
// once, so that a key costs its own bytes once per member.
type ranking struct {
	members []string
	seeds   []uint64
}

func newRanking(members []string) ranking {
	r := ranking{members: members, seeds: make([]uint64, len(members))}
	for i, m := range members {
		h := uint64(fnvOffset)
		for j := 0; j < len(m); j++ {
			h ^= uint64(m[j])
			h *= fnvPrime
		}
		h *= fnvPrime // the zero byte: h ^= 0
		r.seeds[i] = h
	}
	return r
}

// owner is the member of r that should hold key's lease (see owner).
func (r ranking) owner(key string) string {
	best, _ := r.best(key)
	return best
}

// best returns the member of r that should hold key's lease, and key's
// score against it: the highest, the first member's of equal ones.
func (r ranking) best(key string) (best string, top uint64) {
	for i := range r.seeds {
		if s := r.score(i, key); best == "" || s > top {
			best, top = r.members[i], s
		}
	}
	return best, top
}

// score is key's score against the i-th member.
func (r ranking) score(i int, key string) uint64 {
	h := r.seeds[i]
	for j := 0; j < len(key); j++ {
		h ^= uint64(key[j])
		h *= fnvPrime
	}
	return mix(h)
}

// mix spreads FNV's output over all 64 bits (SplitMix64's finaliser).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// ownership is the owners of the targets for a list of members, and each
// target's score against its owner, from which the owners for the next
// list are found (see next).
type ownership struct {
	rank   ranking
	owners map[string]string
	top    map[string]uint64
}

// ownershipOf ranks every one of keys among rank's members.
func ownershipOf(rank ranking, keys []string) *ownership {
	o := &ownership{rank: rank, owners: make(map[string]string, len(keys)), top: make(map[string]uint64, len(keys))}
	for _, k := range keys {
		o.owners[k], o.top[k] = rank.best(k)
	}
	return o
}

// next returns the ownership of keys among rank's members, the same as
// ownershipOf's, found from o's where the members changed little: a member
// that joined takes a key only where its score beats the owner's (one
// score per key and member that joined, not one per member), and only the
// keys of members that left are ranked again among all. A fleet started
// together changes its members a hundred times as its instances join, and
// at 100 members and 10,000 targets ranking every key at each change was
// 15 ms an instance, a hundred times over. Where more than a quarter of
// the members changed, or o is nil, keys are ranked afresh.
func (o *ownership) next(rank ranking, keys []string) *ownership {
	if o == nil {
		return ownershipOf(rank, keys)
	}
	at := make(map[string]int, len(rank.members))
	for i, m := range rank.members {
		at[m] = i
	}
	was := make(map[string]bool, len(o.rank.members))
	left := 0
	for _, m := range o.rank.members {
		was[m] = true
		if _, ok := at[m]; !ok {
			left++
		}
	}
	var joined []int
	for i, m := range rank.members {
		if !was[m] {
			joined = append(joined, i)
		}
	}
	if 4*(len(joined)+left) > len(rank.members) {
		return ownershipOf(rank, keys)
	}
	n := &ownership{rank: rank, owners: make(map[string]string, len(keys)), top: make(map[string]uint64, len(keys))}
	for _, k := range keys {
		owner, known := o.owners[k]
		top, scored := o.top[k]
		i, live := at[owner]
		if !known || !scored || !live {
			n.owners[k], n.top[k] = rank.best(k)
			continue
		}
		// Of equal scores the first member's counts, as in best.
		for _, j := range joined {
			if s := rank.score(j, k); s > top || s == top && j < i {
				owner, top, i = rank.members[j], s, j
			}
		}
		n.owners[k], n.top[k] = owner, top
	}
	return n
}
