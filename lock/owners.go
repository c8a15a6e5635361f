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
	var best string
	var top uint64
	for i, seed := range r.seeds {
		h := seed
		for j := 0; j < len(key); j++ {
			h ^= uint64(key[j])
			h *= fnvPrime
		}
		if s := mix(h); best == "" || s > top {
			best, top = r.members[i], s
		}
	}
	return best
}

// owners returns the owner of each of keys.
func (r ranking) owners(keys []string) map[string]string {
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k] = r.owner(k)
	}
	return m
}

// mix spreads FNV's output over all 64 bits (SplitMix64's finaliser).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
