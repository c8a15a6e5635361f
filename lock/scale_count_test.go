package lock

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pgcluster/pgcluster/health"
)

// The scale benchmark's count of the targets Up in each View, made from
// the entries that may have changed since the last View counted, is the
// count of every entry, through Edits, folds, and Views made whole.
func TestScaleCountUp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	states := []health.State{health.Up, health.Down, health.Unknown}
	in := &scaleInstance{}
	var v health.View
	for step := range 3000 {
		switch rng.IntN(20) {
		case 0:
			m := map[string]health.Verdict{}
			for i := range 300 {
				m[fmt.Sprint(i)] = health.Verdict{State: states[rng.IntN(2)]}
			}
			v = health.ViewOf(m)
		default:
			e := v.Edit()
			for range rng.IntN(40) {
				k := fmt.Sprint(rng.IntN(320))
				if rng.IntN(10) == 0 {
					e.Delete(k)
				} else {
					e.Set(k, health.Verdict{State: states[rng.IntN(3)]})
				}
			}
			v = e.View()
		}
		if got, want := in.countUp(v), upIn(v); got != want {
			t.Fatalf("step %d: counted %d Up, want %d", step, got, want)
		}
	}
}
