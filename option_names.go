package pgcluster

import (
	"fmt"
	"strings"
)

// optionNames are the options parseOption takes, in its order: a misspelt
// option is answered with the nearest of them. option_names_test.go keeps
// the list equal to parseOption's case labels.
var optionNames = []string{
	"postgres", "ttl", "refresh", "stale_after", "allow_loopback", "self",
	"check", "interval", "timeout", "rise", "fall", "max_lag", "all_down", "role_interval", "split_brain", "primary_hold", "probe_budget",
	"redis", "redis_prefix", "redis_secret",
	"relay", "relay_grace",
	"ns", "soa",
	"topology", "min_local",
	"location", "check_scope", "probe_source",
	"fallthrough",
}

// unknownOption is the error text for an option pgcluster does not know:
// with the known option it most likely stands for, if any.
func unknownOption(opt string) string {
	if near := nearestOption(opt); near != "" {
		return fmt.Sprintf("unknown property %q; did you mean %q?", opt, near)
	}
	return fmt.Sprintf("unknown property %q", opt)
}

// nearestOption returns the known option closest to opt in edits (a
// letter added, dropped, changed, or two swapped; case ignored), when it is
// near enough to be the one meant: at most two edits, and at most one for
// every three letters of opt, so that a short word is not taken for any
// short option. Ties go to the first in optionNames.
func nearestOption(opt string) string {
	opt = strings.ToLower(opt)
	best, bestD := "", 3
	for _, name := range optionNames {
		if d := editDistance(opt, name); d < bestD && 3*d <= len(opt) {
			best, bestD = name, d
		}
	}
	return best
}

// editDistance is the optimal string alignment distance between a and b:
// the Levenshtein distance with the swap of two adjacent letters as one
// edit, the most common slip of a typist.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}
