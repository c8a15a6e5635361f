package health

import (
	"fmt"
	"iter"
	"maps"
	"math"
	"reflect"
	"sync/atomic"
)

// View is an immutable set of verdicts by target Key; a target absent from
// it is Unknown. The zero View is empty. Views are handed from the checker
// and the fleet's coordinator to the plugin whole, and never written once
// made.
//
// A View made from another by a few changes (Edit) shares the other's
// entries instead of copying them: every instance of a fleet makes a new
// View for each change the fleet publishes, and at 10,000 targets a copy
// of every entry per change was most of an instance's work during a flip
// (and of its garbage). Its changes are kept beside the shared entries
// until they number about the square root of the entries, then folded
// into entries of its own: an Edit costs its changes plus, amortised,
// about as many entries again. An entry is a pointer to its verdict, never
// written once made, so that a fold copies a word per entry, not the
// verdict: at 10,000 targets a fold of whole verdicts touched 1.5 MB of
// fresh memory, and folds were most of what a fleet's start made anew.
type View struct {
	base *viewBase
	over map[string]viewSlot // keys set or deleted since base
	n    int
}

// viewBase is the entries Views share.
type viewBase struct {
	m   map[string]*Verdict
	gen uint64 // unique to this base
	// folded says this base was folded from the one whose gen is parent
	// (0: the zero View's, none), changed the keys whose verdicts may
	// differ from it; a View of a whole map (ViewOf) has none.
	folded  bool
	parent  uint64
	changed []string
}

// viewSlot is a key's verdict set since a View's base; nil: deleted.
type viewSlot struct {
	v *Verdict
}

// viewGens numbers bases, from 1: gen 0 is the zero View's.
var viewGens atomic.Uint64

// ViewOf makes a View of m's verdicts. m is not kept.
func ViewOf(m map[string]Verdict) View {
	b := NewViewBuilder(len(m))
	for k, x := range m {
		b.Set(k, x)
	}
	return b.View()
}

// ViewBuilder makes a View entry by entry, with one allocation for the
// verdicts of as many entries as it was sized for: entries later set one
// by one (Edit) point elsewhere, and once no View points into it, it is
// freed whole.
type ViewBuilder struct {
	slab []Verdict
	m    map[string]*Verdict
}

// NewViewBuilder starts a View of about n entries.
func NewViewBuilder(n int) *ViewBuilder {
	return &ViewBuilder{slab: make([]Verdict, 0, n), m: make(map[string]*Verdict, n)}
}

// Set gives key the verdict x. A key is set once.
func (b *ViewBuilder) Set(key string, x Verdict) {
	b.slab = append(b.slab, x)
	b.m[key] = &b.slab[len(b.slab)-1]
}

// View makes the View; b is not used again.
func (b *ViewBuilder) View() View {
	if len(b.m) == 0 {
		return View{}
	}
	v := View{base: &viewBase{m: b.m, gen: viewGens.Add(1)}, n: len(b.m)}
	b.slab, b.m = nil, nil
	return v
}

// Len is the number of verdicts in v.
func (v View) Len() int { return v.n }

// Get returns key's verdict, and whether v has one.
func (v View) Get(key string) (Verdict, bool) {
	if s, ok := v.over[key]; ok {
		if s.v == nil {
			return Verdict{}, false
		}
		return *s.v, true
	}
	if v.base == nil {
		return Verdict{}, false
	}
	if x, ok := v.base.m[key]; ok {
		return *x, true
	}
	return Verdict{}, false
}

// At returns key's verdict, the zero Verdict (Unknown) when v has none.
func (v View) At(key string) Verdict {
	x, _ := v.Get(key)
	return x
}

// All yields every verdict of v, in no order.
func (v View) All() iter.Seq2[string, Verdict] {
	return func(yield func(string, Verdict) bool) {
		if v.base != nil {
			for k, x := range v.base.m {
				if _, ok := v.over[k]; ok {
					continue
				}
				if !yield(k, *x) {
					return
				}
			}
		}
		for k, s := range v.over {
			if s.v != nil && !yield(k, *s.v) {
				return
			}
		}
	}
}

// Same reports whether v and o are one View: an Edit that changed
// nothing gives back the View it was made from.
func (v View) Same(o View) bool {
	return v.base == o.base && v.n == o.n && len(v.over) == len(o.over) &&
		reflect.ValueOf(v.over).UnsafePointer() == reflect.ValueOf(o.over).UnsafePointer()
}

// Changed returns the keys whose verdicts may differ between was and v (a
// superset: each is to be compared), when that is known without a pass
// over every entry: v was made from was, or both from one View, by Edits
// folded at most once since. Otherwise ok is false.
func (v View) Changed(was View) (keys []string, ok bool) {
	var vb, wb uint64
	if v.base != nil {
		vb = v.base.gen
	}
	if was.base != nil {
		wb = was.base.gen
	}
	switch {
	case vb == wb:
	case v.base != nil && v.base.folded && v.base.parent == wb:
		keys = append(keys, v.base.changed...)
	default:
		return nil, false
	}
	for k := range v.over {
		keys = append(keys, k)
	}
	for k := range was.over {
		keys = append(keys, k)
	}
	return keys, true
}

// ViewEdit makes a View from another by changes (see View.Edit).
type ViewEdit struct {
	from View
	set  map[string]viewSlot
}

// Edit starts a View that is v with the changes made to the returned
// ViewEdit; v itself never changes.
func (v View) Edit() *ViewEdit {
	return &ViewEdit{from: v, set: map[string]viewSlot{}}
}

// Set gives key the verdict x.
func (e *ViewEdit) Set(key string, x Verdict) { e.set[key] = viewSlot{v: &x} }

// Delete leaves key without a verdict.
func (e *ViewEdit) Delete(key string) { e.set[key] = viewSlot{} }

// View makes the View: the one Edit began from with every change since.
func (e *ViewEdit) View() View {
	from := e.from
	// A key set to the verdict it has is no change: a View made
	// again from the keys that may have changed (lock's) sets many
	// that did not, which must neither be copied on nor bring the fold
	// closer.
	n := from.n
	for k, s := range e.set {
		x, had := from.Get(k)
		switch {
		case had && s.v == nil:
			n--
		case !had && s.v != nil:
			n++
		case !had || x.Equal(*s.v, true) && x.Last.Equal(s.v.Last):
			delete(e.set, k)
		}
	}
	if len(e.set) == 0 {
		return from
	}
	over := make(map[string]viewSlot, len(from.over)+len(e.set))
	maps.Copy(over, from.over)
	maps.Copy(over, e.set)
	if len(over) <= foldAfter(n) {
		return View{base: from.base, over: over, n: n}
	}
	// Fold: entries of its own, which the next Views share.
	m := make(map[string]*Verdict, n)
	var parent uint64
	if from.base != nil {
		maps.Copy(m, from.base.m)
		parent = from.base.gen
	}
	changed := make([]string, 0, len(over))
	for k, s := range over {
		changed = append(changed, k)
		if s.v == nil {
			delete(m, k)
		} else {
			m[k] = s.v
		}
	}
	return View{base: &viewBase{m: m, gen: viewGens.Add(1), folded: true, parent: parent, changed: changed}, n: n}
}

// foldAfter is how many changes a View of n verdicts keeps beside the
// entries it shares before it folds them in: about √n, so that an Edit's
// copy of them and a fold's copy of every entry, once per as many
// changes, cost about the same.
func foldAfter(n int) int {
	return max(32, int(math.Sqrt(float64(n))))
}

// String prints v as a map of its verdicts, keys in order.
func (v View) String() string {
	return fmt.Sprint(maps.Collect(v.All()))
}
