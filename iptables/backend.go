package iptables

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Backend is the iptables flavour: the legacy (x_tables) kernel API or
// nf_tables. Rules must go where the rest of the node (kubelet, CNI)
// writes theirs, or the two sets of rules never see each other.
type Backend string

// The values of --iptables-backend.
const (
	BackendAuto   Backend = "auto"
	BackendLegacy Backend = "legacy"
	BackendNFT    Backend = "nft"
)

// ParseBackend parses a --iptables-backend value; "" means auto.
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(strings.ToLower(strings.TrimSpace(s))); b {
	case "", BackendAuto:
		return BackendAuto, nil
	case BackendLegacy, BackendNFT:
		return b, nil
	}
	return "", fmt.Errorf("iptables: unknown backend %q (want auto, legacy or nft)", s)
}

// ResolveBackend returns the backend the proxy writes its rules with, and
// a warning for the operator when it is not the one asked for. "auto"
// detects it (DetectBackend); the result must then take a write: a kernel
// can have nf_tables without its ip family (Debian's user-mode Linux 6.1),
// where iptables-nft-save prints an empty ruleset, detection picks nft on
// a tie, and every restore would fail with "TABLE_ADD failed (Operation not
// supported)" forever. So the proxy writes its IPv4 canary chain (which it
// writes anyway) with the chosen backend first: if that fails, "auto" falls
// back to the other backend with one warning, and an explicit backend is a
// start-up error naming --iptables-backend. It writes; the read-only
// commands (diff, status, cleanup) use DetectBackend.
func ResolveBackend(requested Backend) (Backend, string, error) {
	if !HaveTools() {
		return "", "", ErrNoTools
	}
	return resolveBackend(execRun, requested)
}

func resolveBackend(run runFunc, requested Backend) (Backend, string, error) {
	if requested != "" && requested != BackendAuto {
		if err := probeWrite(run, requested); err != nil {
			return "", "", fmt.Errorf("iptables: --iptables-backend=%s cannot write rules on this kernel: %v (use --iptables-backend=%s or auto)",
				requested, err, otherBackend(requested))
		}
		return requested, "", nil
	}
	detected, err := detectBackend(run)
	if err != nil {
		return "", "", err
	}
	derr := probeWrite(run, detected)
	if derr == nil {
		return detected, "", nil
	}
	other := otherBackend(detected)
	if oerr := probeWrite(run, other); oerr != nil {
		return "", "", fmt.Errorf("iptables: neither backend can write rules on this kernel (%s: %v; %s: %v): check its netfilter modules, or set --iptables-backend",
			detected, derr, other, oerr)
	}
	return other, fmt.Sprintf("the detected iptables backend %s cannot write rules on this kernel (%v); using %s", detected, derr, other), nil
}

// probeWrite declares the canary chain in the IPv4 nat table: the smallest
// write that makes the backend create its table, and one the proxy makes
// anyway (an existing, empty canary stays as it is).
func probeWrite(run runFunc, b Backend) error {
	r := &ExecRunner{family: IPv4, backend: b, Timeout: 30 * time.Second, run: run}
	return r.Restore([]byte("*" + TableNAT + "\n:" + ChainCanary + " - [0:0]\nCOMMIT\n"))
}

func otherBackend(b Backend) Backend {
	if b == BackendNFT {
		return BackendLegacy
	}
	return BackendNFT
}

// Hint chains kubelet creates in the mangle table of the backend it uses.
var kubeletHints = []string{":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY "}

// DetectBackend picks the backend the rest of the node uses, as
// kubernetes-sigs/iptables-wrappers does: the backend holding kubelet's
// hint chains wins (nft checked first); otherwise the one showing more
// rules; on a tie nft, unless its tools do not work.
func DetectBackend() (Backend, error) {
	if !HaveTools() {
		return "", ErrNoTools
	}
	return detectBackend(execRun)
}

func detectBackend(run runFunc) (Backend, error) {
	// save runs both families' save tools and reports the output and
	// whether at least one of them worked. nft-save is given 5 s: some
	// iptables-nft versions loop forever on odd rulesets.
	save := func(b Backend, args ...string) (string, bool) {
		var all strings.Builder
		ok := false
		for _, fam := range []Family{IPv4, IPv6} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			out, _, err := run(ctx, binary(fam, b, "save"), args, nil)
			cancel()
			if err == nil {
				ok = true
				all.Write(out)
				all.WriteByte('\n')
			}
		}
		return all.String(), ok
	}
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		if out, _ := save(b, "-t", "mangle"); hasHint(out) {
			return b, nil
		}
	}
	legacyOut, legacyOK := save(BackendLegacy)
	nftOut, nftOK := save(BackendNFT)
	switch {
	case !legacyOK && !nftOK:
		return "", errors.New("iptables: neither iptables-legacy-save nor iptables-nft-save works")
	case !nftOK, legacyOK && countRules(legacyOut) > countRules(nftOut):
		return BackendLegacy, nil
	}
	return BackendNFT, nil
}

func hasHint(save string) bool {
	for _, l := range strings.Split(save, "\n") {
		for _, h := range kubeletHints {
			if strings.HasPrefix(l, h) {
				return true
			}
		}
	}
	return false
}

func countRules(save string) int {
	n := 0
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "-") {
			n++
		}
	}
	return n
}
