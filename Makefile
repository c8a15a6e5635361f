# pgcluster's commands. See README.md.
#
#   make build   bin/coredns, bin/pgclusterctl, bin/pgdiscover
#   make test    install what is missing, then vet, gofmt, every test, and
#                TEST_FUZZTIME (3s) of each fuzz target
#   make run     install what is missing, build, start the local demo
#   make bench   the benchmarks
#   make chaos   the fleet under load and faults (CHAOS_DURATION, default 120s)
#   make fuzz    each fuzz target in turn for FUZZTIME (default 5m)
#   make image   the container image (podman), FROM scratch: see Containerfile
#   make test-build  the deployment tests alone: a CoreDNS built through
#                plugin.cfg, the image, deploy/'s Corefiles, manifests and unit
#   make clean   remove what the build wrote

# Go lives in /usr/local/go on the machines this runs on; it need not be on PATH.
export PATH := $(if $(wildcard /usr/local/go/bin/go),/usr/local/go/bin:)$(PATH)
export CI

GO         ?= go
MODULE     := github.com/pgcluster/pgcluster
TESTFLAGS  ?=
RUN_ARGS   ?=
# make chaos: how long the load and the faults last (a Go duration), and
# the check the fleet runs (tcp, or postgres: see the chaos target).
CHAOS_DURATION ?= 120s
CHAOS_CHECK ?= tcp
# make fuzz: how long each target runs (a Go duration, or Nx for N inputs),
# how many inputs at once, and which targets (a regexp of their names).
FUZZTIME   ?= 5m
FUZZPARALLEL ?= 2
FUZZ       ?= .
# make test: how long it fuzzes each target after the tests (seeds alone: 0).
TEST_FUZZTIME ?= 3s

# make image: the image's name, and the directory its build context is
# staged in (the static binary, the CA bundle, deploy/image/'s files).
IMAGE      ?= localhost/pgcluster-coredns:latest
IMAGE_DIR  ?= bin/image
GIT_COMMIT := $(shell git describe --always --dirty 2>/dev/null)

.PHONY: all build setup test test-build vet fmt-check run bench chaos fuzz image clean

all: build

build:
	$(GO) build -o bin/coredns ./cmd/coredns
	$(GO) build -o bin/pgclusterctl ./cmd/pgclusterctl
	$(GO) build -o bin/pgdiscover ./cmd/pgdiscover

setup:
	./scripts/setup.sh

vet:
	$(GO) vet ./...

fmt-check:
	@files="$$(find . -name '*.go' -not -path './.git/*' -not -path './bin/*' -not -path './tmp/*' -print0 | xargs -0 -r gofmt -l)"; \
	if [ -n "$$files" ]; then echo "gofmt: these files are not formatted (run gofmt -w):"; echo "$$files"; exit 1; fi

# The race detector slows tests several times over; -p 2 keeps a 2-core
# machine busy without starving the servers the tests start. go test starts
# packages in the order given: the longest first (test/, about half of the
# whole), so that it runs beside the others rather than alone at the end.
TEST_FIRST := ./test/ ./deploy/ . ./discovery/ ./internal/cmd/demo/ ./lock/
test: setup
	$(GO) vet ./...
	@$(MAKE) --no-print-directory fmt-check
	$(GO) test -race -count=1 -p 2 -timeout 20m $(TESTFLAGS) $(TEST_FIRST) \
		$$($(GO) list ./... | grep -vxF -e '$(MODULE)/test' -e '$(MODULE)/deploy' -e '$(MODULE)' \
			-e '$(MODULE)/discovery' -e '$(MODULE)/internal/cmd/demo' -e '$(MODULE)/lock')
	@if [ "$(TEST_FUZZTIME)" != 0 ]; then $(MAKE) --no-print-directory fuzz FUZZ='$(FUZZ)' FUZZTIME=$(TEST_FUZZTIME); fi

# The deployment tests (deploy/): also part of make test.
test-build: setup
	$(GO) test -count=1 -v -timeout 30m $(TESTFLAGS) ./deploy/

run: setup
	@$(MAKE) --no-print-directory build
	$(GO) build -o bin/demo ./internal/cmd/demo
	./bin/demo -coredns bin/coredns $(RUN_ARGS)

# The Go benchmarks, then test/'s end-to-end ones and lock/'s scale ones,
# each run once, with a timeout fit for each: the fleet and the relay, the
# registry at scale (under 10 minutes), the QPS of a signed zone against an
# unsigned one and of topology local with ECS against topology off (30 s each), switchovers, drains and an alias's fail-over under a
# flapping primary (about 3 minutes), 40 real instances over 1,000 backends,
# and many coordinators in one process against one Redis, steady and with
# Redis stalled (SCALE_SIZES and SCALE_STALLS: see lock/scale_bench_test.go).
# Each -bench pattern names its benchmarks whole: "Fleet" alone would also
# run BenchmarkFleetScale, under go test's default 10-minute timeout.
bench:
	$(GO) test -run '^$$' -bench . -benchmem $$($(GO) list ./... | grep -v -e '/test$$' -e '/lock$$')
	$(GO) test -run '^$$' -bench '^Benchmark(Tend|View|TakeAll)$$' -benchmem ./lock/
	$(GO) test -run '^$$' -bench '^Benchmark(Fleet|FleetRelay|RelayStall)$$' -benchtime 1x ./test/
	$(GO) test -run '^$$' -bench '^BenchmarkRegistryScale$$' -benchtime 1x -timeout 30m ./test/
	$(GO) test -run '^$$' -bench '^Benchmark(DNSSEC|TopologyQPS)$$' -benchtime 1x ./test/
	$(GO) test -run '^$$' -bench '^BenchmarkSwitchover$$' -benchtime 1x -timeout 30m ./test/
	$(GO) test -run '^$$' -bench '^Benchmark(Drain|AliasFlap)$$' -benchtime 1x -timeout 15m ./test/
	$(GO) test -run '^$$' -bench '^BenchmarkFleetScale$$' -benchtime 1x -timeout 30m ./test/
	$(GO) test -run '^$$' -bench '^BenchmarkScale(Stall)?$$' -benchtime 1x -timeout 60m ./lock/

# The chaos run: TestChaos for CHAOS_DURATION, its report on
# stdout; it fails past its limits (any SERVFAIL or wrong answer, timeouts
# at 0.01% of queries or more). make test runs it for 20s, with check tcp.
# make chaos CHAOS_CHECK=postgres runs it with check postgres and its role
# sessions: cluster pgc two real PostgreSQL servers whose role swaps are
# real switchovers, the local nodes forwarded to a real standby (see
# test/chaos_pg_test.go). It stays out of make test: a run takes 2-5
# minutes where the 20s run with check tcp takes about 75 s.
chaos: setup
	CHAOS_CHECK=$(CHAOS_CHECK) CHAOS_DURATION=$(CHAOS_DURATION) $(GO) test -race -count=1 -v -timeout 60m -run '^TestChaos$$' $(TESTFLAGS) ./test/

# Every fuzz target (a func FuzzX in a _test.go file) in turn, for FUZZTIME
# each: a failure stops the run, its input written under the package's
# testdata/fuzz/FuzzX/ (keep it there as a regression seed once fixed).
# make test runs every seed (plain go test does), then each target for
# TEST_FUZZTIME. A run that ends in nothing but "context deadline exceeded"
# (no failing input written, no panic, no test line) is Go 1.26's fuzzing
# engine racing its own -fuzztime deadline: that target runs once more; a
# second such end, or any real failure, fails.
fuzz:
	@set -e; grep -rHoE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' . | grep -vE '^./(bin|tmp)/' | \
	sed -E 's|^(.*)/[^/]*:func (Fuzz.*)$$|\1 \2|' | grep -E " .*($(FUZZ))" | sort | \
	while read -r pkg name; do \
		echo "== $$name ($$pkg), $(FUZZTIME)"; \
		for try in 1 2; do \
			log=$$(mktemp); \
			if $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -parallel $(FUZZPARALLEL) $$pkg </dev/null >$$log 2>&1; \
				then cat $$log; rm -f $$log; break; fi; \
			cat $$log; \
			if [ $$try = 1 ] && grep -q 'context deadline exceeded' $$log && ! grep -qE 'Failing input written|panic:|_test.go:[0-9]+:' $$log; then \
				echo "== $$name: the fuzzing engine's own deadline race at the end of -fuzztime (go.dev/issue/75804, fixed in Go 1.27), no input failed: once more"; \
				rm -f $$log; continue; \
			fi; \
			rm -f $$log; exit 1; \
		done; \
	done

# A static binary (CGO_ENABLED=0: no libc in the image) and the files of
# deploy/image/, built into an image FROM scratch: nothing is pulled.
image: setup
	mkdir -p $(IMAGE_DIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w -X github.com/coredns/coredns/coremain.GitCommit=$(GIT_COMMIT)' \
		-o $(IMAGE_DIR)/coredns ./cmd/coredns
	cp deploy/image/passwd deploy/image/group deploy/image/Corefile /etc/ssl/certs/ca-certificates.crt $(IMAGE_DIR)/
	podman build --pull=never -f Containerfile -t $(IMAGE) $(IMAGE_DIR)
	@podman image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)

clean:
	rm -rf bin
