# vmipam: IP address management for virtual machines on Kubernetes.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
BIN := $(CURDIR)/bin
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)

# Fuzz targets whose seed corpus runs in `make test`; `make fuzz` explores.
FUZZTIME ?= 30s
FUZZ_TARGETS := ipam:FuzzParseRanges ipam:FuzzDecodeBlock ipam:FuzzOperations

.PHONY: help
help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build every package.
	$(GO) build ./...

.PHONY: test
test: ## Unit, property and fuzz-seed tests under -race.
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

.PHONY: bench
bench: ## Print the allocator benchmarks.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./ipam/

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME.
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn ($$FUZZTIME)"; \
		$(GO) test ./$$pkg -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME); \
	done

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/golangci-lint $@

.PHONY: run
run: ## Run vmipam on a local control plane (arrives with the webhook; see README).
	@echo "make run needs the admission webhook and the local control plane, which are not built yet." >&2
	@echo "Today vmipam is the allocator core in ipam/: try 'make test' and 'make bench'." >&2
	@exit 1
