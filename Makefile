# pgcluster's commands. See README.md.
#
#   make build   bin/coredns (and bin/pgdiscover once cmd/pgdiscover exists)
#   make test    install what is missing, then vet, gofmt and every test
#   make run     install what is missing, build, start the local demo
#   make bench   the benchmarks
#   make clean   remove what the build wrote

# Go lives in /usr/local/go on the machines this runs on; it need not be on PATH.
export PATH := $(if $(wildcard /usr/local/go/bin/go),/usr/local/go/bin:)$(PATH)
export CI

GO         ?= go
TESTFLAGS  ?=
RUN_ARGS   ?=
PGDISCOVER := $(if $(wildcard cmd/pgdiscover/*.go),bin/pgdiscover)

.PHONY: all build setup test vet fmt-check run bench clean

all: build

build:
	$(GO) build -o bin/coredns ./cmd/coredns
ifneq ($(PGDISCOVER),)
	$(GO) build -o bin/pgdiscover ./cmd/pgdiscover
endif

setup:
	./scripts/setup.sh

vet:
	$(GO) vet ./...

fmt-check:
	@files="$$(find . -name '*.go' -not -path './.git/*' -not -path './bin/*' -not -path './tmp/*' -print0 | xargs -0 -r gofmt -l)"; \
	if [ -n "$$files" ]; then echo "gofmt: these files are not formatted (run gofmt -w):"; echo "$$files"; exit 1; fi

# The race detector slows tests several times over; -p 2 keeps a 2-core
# machine busy without starving the servers the tests start.
test: setup
	$(GO) vet ./...
	@$(MAKE) --no-print-directory fmt-check
	$(GO) test -race -count=1 -p 2 -timeout 20m $(TESTFLAGS) ./...

run: setup
	@$(MAKE) --no-print-directory build
	$(GO) build -o bin/demo ./internal/cmd/demo
	./bin/demo -coredns bin/coredns $(RUN_ARGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf bin
