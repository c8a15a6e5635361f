package lock

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
)

// referenceOwner is rendezvous hashing as the fleet has always computed
// it, with hash/fnv: every instance of a fleet must give each key to the
// same member, whichever version of the code it runs.
func referenceOwner(members []string, key string) string {
	var best string
	var top uint64
	for _, m := range members {
		h := fnv.New64a()
		h.Write([]byte(m))
		h.Write([]byte{0})
		h.Write([]byte(key))
		s := mix(h.Sum64())
		if best == "" || s > top {
			best, top = m, s
		}
	}
	return best
}

// The owners a ranking computes, one by one or for many keys, are the
// ones hash/fnv gives, for any tokens and keys (empty, long, any byte).
func TestOwnerSameAssignment(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return string(b)
	}
	for round := range 50 {
		var members []string
		for i := range rng.IntN(40) {
			members = append(members, fmt.Sprintf("%032x", rng.Uint64())+word(i%3))
		}
		r := newRanking(members)
		var keys []string
		for i := range 200 {
			keys = append(keys, word(rng.IntN(3+i%60)))
		}
		all := r.owners(keys)
		for _, k := range keys {
			want := referenceOwner(members, k)
			if got := r.owner(k); got != want {
				t.Fatalf("round %d, key %q: owner %q, want %q", round, k, got, want)
			}
			if all[k] != want || owner(members, k) != want {
				t.Fatalf("round %d, key %q: owners %q, owner %q, want %q", round, k, all[k], owner(members, k), want)
			}
		}
	}
}
