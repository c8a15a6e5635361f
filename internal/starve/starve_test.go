package starve

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// Forty goroutines taking turns on one processor, 5 ms each, keep each
// other waiting about 200 ms: starvation; a look at a time to come finds
// none.
func TestSince(t *testing.T) {
	before := time.Now()
	Look()
	if Since(before) {
		// Something in this process waited before the test: look again
		// from now.
		before = time.Now()
		Look()
		if Since(before) {
			t.Fatal("an idle process counts as starved")
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	began := time.Now()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 40 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				spin := time.Now()
				for time.Since(spin) < 5*time.Millisecond {
				}
				runtime.Gosched()
			}
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for !Since(began) {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatal("40 goroutines sharing one processor for 10 s: never starved")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if Since(time.Now().Add(time.Second)) {
		t.Fatal("starvation counted for a time to come")
	}
}
