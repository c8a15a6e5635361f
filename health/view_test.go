package health

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// A View made by Edits, folded or not, holds what a map given the same
// changes holds; the Views it was made from keep what they held; and
// Changed names every key that differs between any two of them that it
// answers for.
func TestViewEdits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() string { return "c/n" + string(rune('a'+rng.IntN(26))) + string(rune('a'+rng.IntN(40))) }
	type kept struct {
		v View
		m map[string]Verdict
	}
	var history []kept
	v, m := View{}, map[string]Verdict{}
	folds := 0
	for step := range 3000 {
		e := v.Edit()
		for range 1 + rng.IntN(8) {
			k := key()
			if rng.IntN(4) == 0 {
				e.Delete(k)
				delete(m, k)
			} else {
				x := Verdict{State: State(1 + rng.IntN(2)), WAL: uint64(step)}
				e.Set(k, x)
				m[k] = x
			}
		}
		was := v
		v = e.View()
		if v.base != was.base {
			folds++
		}
		history = append(history, kept{v, maps.Clone(m)})
		if v.Len() != len(m) {
			t.Fatalf("step %d: Len %d, want %d", step, v.Len(), len(m))
		}
		if got := maps.Collect(v.All()); !maps.EqualFunc(got, m, func(a, b Verdict) bool { return a.Equal(b, true) }) {
			t.Fatalf("step %d: All gives %d verdicts unlike the map's %d", step, len(got), len(m))
		}
	}
	if folds == 0 {
		t.Fatal("no View folded its changes: the test does not try folding")
	}
	for i, h := range history {
		if got := maps.Collect(h.v.All()); len(got) != len(h.m) {
			t.Fatalf("View %d changed after later Edits: %d verdicts, was %d", i, len(got), len(h.m))
		}
		for k, x := range h.m {
			if y, ok := h.v.Get(k); !ok || !y.Equal(x, true) {
				t.Fatalf("View %d changed after later Edits at %s", i, k)
			}
		}
	}
	// Changed, for pairs near and far apart.
	answered := 0
	for range 2000 {
		i := rng.IntN(len(history))
		j := min(len(history)-1, i+rng.IntN(6))
		was, is := history[i], history[j]
		keys, ok := is.v.Changed(was.v)
		if !ok {
			continue
		}
		answered++
		for k := range mapsUnion(was.m, is.m) {
			a, aok := was.m[k]
			b, bok := is.m[k]
			if (aok != bok || !a.Equal(b, true)) && !slices.Contains(keys, k) {
				t.Fatalf("Views %d and %d differ at %s, which Changed does not name", i, j, k)
			}
		}
	}
	if answered < 1000 {
		t.Fatalf("Changed answered for %d pairs of 2000: it should for most near ones", answered)
	}
}

// Changed never takes a View of a whole map for one made by Edits from
// the View before it: the first View a plugin gets, after the zero View
// it starts from, has every verdict new.
func TestViewChangedWhole(t *testing.T) {
	m := map[string]Verdict{"c/a": {State: Up}, "c/b": {State: Down}}
	whole := ViewOf(m)
	for _, was := range []View{{}, ViewOf(map[string]Verdict{"c/a": {State: Up}})} {
		keys, ok := whole.Changed(was)
		if ok && !(slices.Contains(keys, "c/a") && slices.Contains(keys, "c/b")) {
			t.Errorf("Changed(%v) of a View of a whole map: %q, ok; want not ok, or both keys", was, keys)
		}
	}
	e := View{}.Edit()
	e.Set("c/a", Verdict{State: Up})
	if keys, ok := e.View().Changed(View{}); !ok || !slices.Equal(keys, []string{"c/a"}) {
		t.Errorf("an Edit of the zero View: Changed %q, %v; want [c/a], true", keys, ok)
	}
}

func mapsUnion(a, b map[string]Verdict) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// An Edit of a View of 10,000 verdicts costs its changes, not the
// entries: a View a fleet makes for every change must not copy them all.
func BenchmarkViewEdit(b *testing.B) {
	m := map[string]Verdict{}
	for i := range 10000 {
		m["c/n"+string(rune(i))] = Verdict{State: Up}
	}
	v := ViewOf(m)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e := v.Edit()
		e.Set("c/n"+string(rune(i%10000)), Verdict{State: State(1 + i%2)})
		v = e.View()
	}
}

// Same: an Edit that changes nothing gives back the View it was made
// from; one that changes anything, or another View of the same entries,
// is another.
func TestViewSame(t *testing.T) {
	up := Verdict{State: Up}
	v := ViewOf(map[string]Verdict{"a": up, "b": up})
	if !v.Same(v) || !(View{}).Same(View{}) {
		t.Fatal("a View is not the same as itself")
	}
	e := v.Edit()
	e.Set("a", up)
	if w := e.View(); !w.Same(v) {
		t.Error("an Edit setting a verdict it had gave another View")
	}
	e = v.Edit()
	e.Set("c", up)
	w := e.View()
	if w.Same(v) {
		t.Error("an Edit adding a verdict gave the same View")
	}
	e = w.Edit()
	e.Set("c", Verdict{State: Down})
	if x := e.View(); x.Same(w) || x.Same(v) {
		t.Error("an Edit changing a verdict gave the same View")
	}
	if ViewOf(map[string]Verdict{"a": up, "b": up}).Same(v) {
		t.Error("two Views made apart are the same")
	}
}
