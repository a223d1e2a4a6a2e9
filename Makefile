# ipvsproxy — build, test, demo.
#
#   make test    unit tests (race), lint, then every real-kernel test in the
#                user-mode-Linux sandbox (adapter tests and end-to-end)
#   make demo    boot the sandbox, program example Services, show ipvsadm
#                and real traffic
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
STATICCHECK := $(shell $(GO) env GOPATH)/bin/staticcheck
STATICCHECK_VERSION ?= v0.8.2
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The commit's date, not the build's: the same commit builds the same binary.
BUILD_DATE ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo unknown)
APP_PKG := github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/app
# component-base panics at start on a gitVersion that is not vX.Y.Z…:
# an untagged build is v0.0.0-<describe>.
K8S_VERSION := $(shell echo '$(VERSION)' | grep -Eq '^v[0-9]+\.[0-9]+\.[0-9]+' && echo '$(VERSION)' || echo 'v0.0.0-$(VERSION)')
# `ipvsproxy version`, and kubernetes_build_info's labels (component-base's
# version package, as every Kubernetes component sets it).
LDFLAGS := -X $(APP_PKG).version=$(VERSION) -X $(APP_PKG).commit=$(COMMIT) -X $(APP_PKG).buildDate=$(BUILD_DATE) \
	-X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) -X k8s.io/component-base/version.gitCommit=$(COMMIT) \
	-X k8s.io/component-base/version.buildDate=$(BUILD_DATE)

# Packages with tests that need a real kernel (build tag "sandbox").
SANDBOX_PKGS = $(shell grep -l '^//go:build sandbox' --include='*_test.go' -r . | xargs -r -n1 dirname | sort -u)

.PHONY: all build unit lint sandbox-test e2e test demo bench bench-engine bench-kernel bench-100k clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/ipvsproxy ./cmd/ipvsproxy

# The e2e tools' own host tests (the benchmarks' fake API server and
# process helper) run here too; the e2e suite itself needs the sandbox.
unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -race -count=1 -tags e2e ./e2e/cmd/... ./e2e/internal/...

$(STATICCHECK):
	$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags sandbox ./...
	$(GO) vet -tags e2e ./e2e/...
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags sandbox ./...
	$(STATICCHECK) -tags e2e ./e2e/...

# Adapter tests on a real kernel: each package's sandbox tests are compiled
# on the host and run as root inside user-mode Linux, on both sandbox
# kernels: 6.12 with the nft iptables backend, 6.1 with legacy (its
# nf_tables has no ip family; see e2e/README.md).
SANDBOX_KERNELS ?= 6.12 6.1
sandbox-test:
	@mkdir -p $(BIN)/sandbox
	@set -e; for p in $(SANDBOX_PKGS); do \
	  n=$$(echo $$p | sed 's|^\./||; s|/|-|g'); \
	  $(GO) test -tags sandbox -c -o $(BIN)/sandbox/$$n.test $$p; \
	done
	@set -e; for k in $(SANDBOX_KERNELS); do for p in $(SANDBOX_PKGS); do \
	  n=$$(echo $$p | sed 's|^\./||; s|/|-|g'); \
	  echo "== sandbox ($$k): $$p"; \
	  (cd $$p && E2E_KERNEL=$$k $(CURDIR)/e2e/sandbox/uml-run --timeout 600 -- $(BIN)/sandbox/$$n.test -test.v -test.count=1); \
	done; done

# End-to-end: real kube-apiserver + etcd + ipvsproxy + traffic in the
# sandbox. The whole suite on 6.12 with iptables-nft (most users' nodes);
# then, with iptables-legacy, every test that checks the fixed rules or the
# packets they act on (E2E_LEGACY_RUN). That run boots 6.12 too: the 6.1
# guest hangs now and then in the middle of the suite (2 of 7 runs; see
# e2e/README.md), so 6.1 carries only the adapter tests until that is found.
# E2E_RULES_BACKEND=nftables runs the suite with --rules-backend=nftables
# (e2e/run.sh; default iptables).
E2E_RULES_BACKEND ?= iptables
export E2E_RULES_BACKEND
E2E_LEGACY_RUN ?= ^(TestMasquerade|TestFirewallReloadRestored|TestDriftChainRuleRepaired|TestCleanupKeepsForeign|TestNodePort|TestLoadBalancer|TestExternalIP|TestExternalTrafficPolicyLocal|TestHostPortProtection|TestServiceTCP|TestServiceDualStack)
e2e: build
	e2e/run.sh
	E2E_IPTABLES=legacy E2E_RUN='$(E2E_LEGACY_RUN)' E2E_TIMEOUT=1200 e2e/run.sh

test: unit lint sandbox-test e2e

demo: build
	e2e/demo.sh

# Engine benchmarks (fake kernel), then the kernel benchmark against
# kube-proxy in the sandbox (BENCH_N, default 1000; see docs/benchmarks.md).
# Not part of `make test`.
bench: bench-engine bench-kernel

bench-engine:
	$(GO) test -run '^$$' -bench . -benchmem ./sync/

BENCH_N ?= 1000
bench-kernel: build
	BENCH_N="$(BENCH_N)" e2e/bench.sh

# Issue 9: 100,000 Services x 10 endpoints on the sandbox's kernel, fed
# through a fake API server (e2e/bench100k.sh; BENCH100K_N=2000 for a
# smoke run). Hours at full size; not part of `make test`.
BENCH100K_N ?= 100000
bench-100k: build
	BENCH100K_N="$(BENCH100K_N)" e2e/bench100k.sh

clean:
	rm -rf $(BIN)
