# weft build and test entry points.
GO ?= go

.PHONY: build test vet fmt-check proto up bench bench-tmpfs soak fuzz clean

build:
	$(GO) build -o bin/weft ./cmd/weft

# The whole test suite: formatting, vet, then every package's tests.
test: fmt-check vet
	$(GO) test -count=1 -timeout 25m ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# Regenerate the committed protobuf and gRPC code from proto/weft/v1/*.proto.
# Needs protoc (3.21) and the plugins of the versions the generated files
# name: go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
# google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
proto:
	protoc -I . --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative proto/weft/v1/*.proto

# Start the embedded default cluster (one meta, three data servers, FUSE
# mount at ./weft-mnt). Ctrl-C stops it.
up: build
	./bin/weft up

# Compare a weft up cluster (replicas 1, then 3) with a FUSE loopback of the
# same disk and the disk itself; writes bench-report/. BENCH_ARGS changes the
# weft bench flags (see bench/compare.sh).
bench: build
	bench/compare.sh bench-report

# The same comparison with every backing directory on a tmpfs (needs root).
bench-tmpfs: build
	bench/compare.sh --tmpfs bench-report-tmpfs

# A long randomized fault campaign (internal/campaign) on real processes:
# SOAK_DURATION (default 10m), SOAK_SEED (default: from the clock),
# SOAK_KINDS (default all), SOAK_ENGINE (embedded or etcd), or any flag in
# SOAK_ARGS (go run ./internal/campaign/soak -help). Needs root and FUSE.
# The seed and the schedule are printed first; the same flags replay it.
soak: build
	$(GO) run ./internal/campaign/soak -weft bin/weft $(SOAK_ARGS)

# Every fuzz target (a decoder of bytes from the network or a disk) for
# FUZZTIME each; their seed corpora already run in make test.
FUZZTIME ?= 30s
fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
		pkg=$$(dirname $$f); \
		for t in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
			echo "== $$pkg $$t"; \
			$(GO) test -run XXX -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

clean:
	rm -rf bin
