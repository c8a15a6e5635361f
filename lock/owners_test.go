package lock

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
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
		all := ownershipOf(r, keys).owners
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

// The owners found from the last ones as members join and leave (one, a
// few, most of them; into and out of an empty fleet) are the ones ranking
// every key afresh gives, scores and all, in every step of a walk.
func TestOwnershipNextSameAssignment(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprintf("c%d/n%d", i%37, i)
	}
	token := func() string { return fmt.Sprintf("%016x", rng.Uint64()) }
	var members []string
	var o *ownership
	for step := range 200 {
		switch n := len(members); {
		case step%50 == 49: // most of the fleet replaced
			members = members[:n/4]
			for range 30 {
				members = append(members, token())
			}
		case n > 0 && rng.IntN(3) == 0: // some leave
			for range 1 + rng.IntN(min(n, 3)) {
				i := rng.IntN(len(members))
				members = slices.Delete(members, i, i+1)
			}
		default: // some join
			for range 1 + rng.IntN(3) {
				members = append(members, token())
			}
		}
		if step == 120 {
			members = nil
		}
		slices.Sort(members) // a Membership's order
		o = o.next(newRanking(slices.Clone(members)), keys)
		for _, k := range keys {
			want, wantTop := newRanking(members).best(k)
			if want != referenceOwner(members, k) {
				t.Fatalf("step %d: best and the reference differ for %q", step, k)
			}
			if o.owners[k] != want || o.top[k] != wantTop {
				t.Fatalf("step %d (%d members), key %q: owner %q score %x, want %q %x", step, len(members), k, o.owners[k], o.top[k], want, wantTop)
			}
		}
	}
}

// BenchmarkOwnershipJoin: the owners of 10,000 targets found again as a
// member joins a fleet of 100, ranked afresh against found from the last
// ones (next).
func BenchmarkOwnershipJoin(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("c%d/n%d", i%100, i)
	}
	var members []string
	for i := range 100 {
		members = append(members, fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15))
	}
	slices.Sort(members)
	was := ownershipOf(newRanking(members), keys)
	joined := append(slices.Clone(members), "ffff0000ffff0000")
	rank := newRanking(joined)
	b.Run("afresh", func(b *testing.B) {
		for b.Loop() {
			ownershipOf(rank, keys)
		}
	})
	b.Run("next", func(b *testing.B) {
		for b.Loop() {
			was.next(rank, keys)
		}
	})
}
