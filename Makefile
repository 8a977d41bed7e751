# nvmegate — the two commands a newcomer needs:
#   make demo   build and run the gateway on a dev trust domain with a scripted scenario
#   make test   go vet + every test tier (unit, cmd, e2e)

GO          ?= go
BIN         := bin
# Tools built from the Go module proxy once per machine, keyed by version.
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nvmegate/tools
BUF_VERSION := v1.75.0
BUF         := $(TOOLS_CACHE)/buf-$(BUF_VERSION)/buf
# The opa CLI runs `opa test policy/` with the same OPA version as go.mod's.
OPA_VERSION := $(shell $(GO) list -m -f '{{.Version}}' github.com/open-policy-agent/opa)
OPA         := $(TOOLS_CACHE)/opa-$(OPA_VERSION)/opa
# A real Vault server for the tests (scripts/build-vault.sh: ~20 CPU-minutes
# the first time on a machine, cached by version after that).
VAULT_VERSION := v1.21.0
VAULT       := $(TOOLS_CACHE)/vault-$(VAULT_VERSION)/vault
# A real SPIRE server and agent for the e2e tier (scripts/build-spire.sh:
# ~9 CPU-minutes the first time, cached by version after that).
SPIRE_VERSION := v1.13.3
SPIRE       := $(TOOLS_CACHE)/spire-$(SPIRE_VERSION)
# The CSI project's own conformance tests, run against nvmegate-csi (static,
# so that the VM tier's initramfs can carry it; ~1 CPU-minute once).
CSI_SANITY_VERSION := v5.6.0
CSI_SANITY  := $(TOOLS_CACHE)/csi-sanity-$(CSI_SANITY_VERSION)/csi-sanity

.PHONY: all build test deps demo proto lint bench fuzz clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# The e2e tier runs uncached (-count=1): it builds and runs the binaries, and
# Go's test cache does not see those inputs.
# The real-kernel tier (e2e/vm) boots a Linux 6.1 built once per machine
# from Debian's linux-source-6.1 (e2e/vm/build-kernel.sh: ~6-9 minutes on 2
# cores the first time, cached under ~/.cache/nvmegate/vm after that).
# The Linux 6.12 tier boots Debian's prebuilt 6.12 cloud kernel with tlshd
# and nvme-cli 2.13 from Debian 13 (e2e/vm/fetch-*.sh: downloads, ~1 minute
# the first time, cached beside it).
test: deps $(OPA) $(VAULT) $(SPIRE)/spire-server $(CSI_SANITY)
	$(GO) vet ./...
	kernel=$$(./e2e/vm/build-kernel.sh) && k612=$$(./e2e/vm/fetch-kernel-6.12.sh) && u612=$$(./e2e/vm/fetch-userland-trixie.sh) && \
		NVMEGATE_VAULT=$(VAULT) NVMEGATE_VM_KERNEL=$$kernel $(GO) test $$($(GO) list ./... | grep -v /e2e) && \
		NVMEGATE_VAULT=$(VAULT) NVMEGATE_VM_KERNEL=$$kernel NVMEGATE_VM612_KERNEL=$$k612 NVMEGATE_VM612_USERLAND=$$u612 \
		NVMEGATE_SPIRE=$(SPIRE) NVMEGATE_CSI_SANITY=$(CSI_SANITY) $(GO) test -count=1 -timeout 30m ./e2e/...
	$(OPA) test policy/

# Debian packages the tests use (nvme-cli, the kernel tier's toolchain,
# qemu, busybox), installed only when missing.
deps:
	./scripts/deps.sh

$(OPA):
	GOBIN=$(dir $(OPA)) $(GO) install github.com/open-policy-agent/opa@$(OPA_VERSION)

$(CSI_SANITY):
	CGO_ENABLED=0 GOBIN=$(dir $(CSI_SANITY)) $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_SANITY_VERSION)

$(VAULT):
	TOOLS_CACHE=$(TOOLS_CACHE) VAULT_VERSION=$(VAULT_VERSION) ./scripts/build-vault.sh >/dev/null

$(SPIRE)/spire-server:
	TOOLS_CACHE=$(TOOLS_CACHE) SPIRE_VERSION=$(SPIRE_VERSION) ./scripts/build-spire.sh >/dev/null

demo: build
	./scripts/demo.sh

# Regenerates proto/nvmegate/v1/*.pb.go with Debian's protoc and the plugin
# versions pinned in go.mod (tool directives).
proto:
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install -y protobuf-compiler"; exit 1; }
	$(GO) build -o $(BIN)/ google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc
	protoc -I proto \
		--plugin=protoc-gen-go=$(BIN)/protoc-gen-go --go_out=proto --go_opt=paths=source_relative \
		--plugin=protoc-gen-go-grpc=$(BIN)/protoc-gen-go-grpc --go-grpc_out=proto --go-grpc_opt=paths=source_relative \
		proto/nvmegate/v1/*.proto

$(BUF):
	GOBIN=$(dir $(BUF)) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

lint: $(BUF)
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff
	cd proto && $(BUF) lint

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf $(BIN) .demo
