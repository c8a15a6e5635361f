//go:build !race

package test

// raceEnabled: the tests run with the race detector.
const raceEnabled = false
