package test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// loadTimestamp is the sample of the load timestamp gauge of Zone.
const loadTimestamp = `coredns_pgcluster_registry_load_timestamp_seconds{zone="pgcluster.lan."}`

// TestMetricsSameZoneTwice serves one zone from one registry in two server
// blocks: /metrics answers 200, with the time of the last registry load.
func TestMetricsSameZoneTwice(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	port1, _ := proc.FreePort()
	port2, _ := proc.FreePort()
	metricsPort, _ := proc.FreePort()
	block := func(port int) string {
		return fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n }\n}\n",
			Zone, port, metricsPort, pg.DSN(""))
	}
	start := time.Now()
	StartCoreDNS(t, block(port1)+block(port2))
	got := scrapeLoadTime(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if got < float64(start.Unix()-1) || got > float64(time.Now().Unix()+1) {
		t.Errorf("load timestamp %v is not the time of the load (%v)", got, start.Unix())
	}
}

// TestMetricsThroughReload scrapes /metrics while Corefile reloads swap the
// instances, as the reload plugin does: never an error, and afterwards the
// time of the new instance's load.
func TestMetricsThroughReload(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	port, _ := proc.FreePort()
	metricsPort, _ := proc.FreePort()
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	corefile := func(ttl int) string {
		return fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  ttl %d\n }\n}\n",
			Zone, port, metricsPort, pg.DSN(""), ttl)
	}
	s := StartCoreDNS(t, corefile(5))
	scrapeLoadTime(t, metrics)

	stop := make(chan struct{})
	done := make(chan []string)
	go func() {
		var bad []string
		for {
			select {
			case <-stop:
				done <- bad
				return
			default:
			}
			// Connection errors are expected while the listener moves; an
			// answer must be 200.
			if code, body, err := scrape(metrics); err == nil && code != http.StatusOK {
				bad = append(bad, fmt.Sprintf("HTTP %d: %.300s", code, body))
			}
			time.Sleep(2 * time.Millisecond) // pace the scrapes, leave CPU to the reload
		}
	}()
	var reloaded time.Time
	for i := range 5 {
		reloaded = time.Now()
		if err := s.Restart(corefile(6 + i)); err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
	}
	close(stop)
	for _, b := range <-done {
		t.Errorf("/metrics during a reload: %s", b)
	}
	Eventually(t, 10*time.Second, func() error {
		if got := scrapeLoadTime(t, metrics); got < float64(reloaded.Unix()) {
			return fmt.Errorf("load timestamp %v is older than the last reload (%v)", got, reloaded.Unix())
		}
		return nil
	})
}

// scrapeLoadTime GETs url, fails the test unless it answers 200 with the load
// timestamp gauge of Zone, and returns its value.
func scrapeLoadTime(t *testing.T, url string) float64 {
	t.Helper()
	code, body, err := scrape(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if code != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d: %.500s", url, code, body)
	}
	v, ok := metricValue(body, loadTimestamp)
	if !ok {
		t.Fatalf("GET %s: no readable coredns_pgcluster_registry_load_timestamp_seconds for %s", url, Zone)
	}
	return v
}

// scrape GETs url and returns the status code and the body.
func scrape(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
