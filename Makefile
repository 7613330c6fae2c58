# weft build and test entry points.
GO ?= go

.PHONY: build test vet fmt-check up bench clean

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

# Start the embedded default cluster (one meta, three data servers, FUSE
# mount at ./weft-mnt). Ctrl-C stops it.
up: build
	./bin/weft up

clean:
	rm -rf bin
