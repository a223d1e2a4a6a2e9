package iptables

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// On a machine without iptables tools (the nftables image) detection and
// resolution stop at once with ErrNoTools, one line, instead of running
// binaries that are not there.
func TestNoToolsIsOneClearError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if HaveTools() {
		t.Fatal("HaveTools() with an empty PATH")
	}
	if b, err := DetectBackend(); !errors.Is(err, ErrNoTools) {
		t.Errorf("DetectBackend() = %q, %v; want ErrNoTools", b, err)
	}
	for _, req := range []Backend{BackendAuto, BackendNFT, BackendLegacy} {
		if b, _, err := ResolveBackend(req); !errors.Is(err, ErrNoTools) {
			t.Errorf("ResolveBackend(%s) = %q, %v; want ErrNoTools", req, b, err)
		}
	}
}

// Either backend's save and restore are enough; a save alone is not.
func TestHaveTools(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	tool := func(name string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	tool("iptables-legacy-save")
	if HaveTools() {
		t.Error("HaveTools() with iptables-legacy-save alone")
	}
	tool("iptables-legacy-restore")
	if !HaveTools() {
		t.Error("HaveTools() = false with iptables-legacy-save and -restore")
	}
}
