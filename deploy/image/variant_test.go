package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Every variant's roots are locked: `make image-lock` resolves Roots,
// and a variant selects from that lock.
func TestVariantRootsAreLocked(t *testing.T) {
	if Variants[0].Name != "default" || Variants[0].Roots != nil || !Variants[0].IPTables {
		t.Errorf("Variants[0] = %+v, want the default image: every locked package, with iptables", Variants[0])
	}
	for _, v := range Variants {
		for _, r := range v.Roots {
			if !slices.Contains(Roots, r) {
				t.Errorf("variant %s: root %s is not in Roots, so the lock lacks it", v.Name, r)
			}
		}
	}
	if _, err := variantNamed("nope"); err == nil || !strings.Contains(err.Error(), "nftables") {
		t.Errorf("variantNamed(nope): %v, want an error listing the variants", err)
	}
}

// selectPins follows Pre-Depends and Depends through the lock, takes the
// first alternative the lock has, skips Excluded, and keeps only arch.
func TestSelectPinsClosure(t *testing.T) {
	control := map[string]Paragraph{
		"kmod":         {"Depends": "libc6 (>= 2.34), libzstd1 | libzstd-alt, lsb-base"},
		"libc6":        {"Depends": "libgcc-s1"},
		"libgcc-s1":    {"Pre-Depends": "libc6"},
		"libzstd1":     {},
		"dash":         {"Pre-Depends": "libc6", "Depends": "debianutils"},
		"iptables":     {"Depends": "libxtables12"},
		"libxtables12": {},
	}
	var pins []Pin
	for _, arch := range []string{"amd64", "arm64"} {
		for n := range control {
			pins = append(pins, Pin{Arch: arch, Name: n})
		}
	}
	read := func(p Pin) (Paragraph, error) {
		if p.Arch != "amd64" {
			return nil, fmt.Errorf("read %s of %s", p.Name, p.Arch)
		}
		return control[p.Name], nil
	}
	got, err := selectPins(pins, "amd64", Variant{Name: "small", Roots: []string{"dash", "kmod"}}, read)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Arch+"/"+p.Name)
	}
	if want := "amd64/dash amd64/kmod amd64/libc6 amd64/libgcc-s1 amd64/libzstd1"; strings.Join(names, " ") != want {
		t.Errorf("selected %q, want %q", strings.Join(names, " "), want)
	}
	all, err := selectPins(pins, "amd64", Variants[0], read)
	if err != nil || len(all) != len(control) {
		t.Errorf("the default variant: %d pins (%v), want every amd64 pin (%d)", len(all), err, len(control))
	}
	delete(control, "libzstd1")
	pins = slices.DeleteFunc(pins, func(p Pin) bool { return p.Name == "libzstd1" })
	if _, err := selectPins(pins, "amd64", Variant{Name: "small", Roots: []string{"kmod"}}, read); err == nil || !strings.Contains(err.Error(), "make image-lock") {
		t.Errorf("a dependency the lock lacks: %v, want an error naming make image-lock", err)
	}
}

// The nftables variant built from fake packages: only its roots' closure,
// no iptables alternatives, no wrapper; the default build is unchanged by
// the variant's existence (TestBuildIsReproducible covers its digest).
func TestBuildNFTablesVariant(t *testing.T) {
	pins, cache := fakeRoots(t)
	bin := filepath.Join(t.TempDir(), "ipvsproxy")
	os.WriteFile(bin, []byte("binary"), 0o755)
	dl := &downloader{cache: cache, get: func(url string) ([]byte, error) {
		return nil, fmt.Errorf("no network in this test: %s", url)
	}}
	v, err := variantNamed("nftables")
	if err != nil {
		t.Fatal(err)
	}
	m := Meta{Ref: "registry.invalid/ipvsproxy:v9.9.9-nftables", Version: "v9.9.9", Revision: "abc", Epoch: time.Unix(1700000000, 0), Description: v.Description}
	idx, err := build(pins, map[string]string{"amd64": bin}, AppFiles{NodePrep: []byte("#!/bin/sh\n"), IptablesWrapper: []byte("#!/bin/sh\n")}, dl, m, v)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("index: %v", err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || cf.Config.Labels["org.opencontainers.image.description"] != v.Description {
		t.Errorf("labels %v (%v), want the variant's description", cf.Config.Labels, err)
	}
	files := map[string]bool{}
	rc := mutate.Extract(img)
	defer rc.Close()
	for _, name := range tarNames(t, rc) {
		files[strings.TrimSuffix(name, "/")] = true
	}
	for _, want := range []string{"usr/local/bin/ipvsproxy", "usr/local/bin/ipvsproxy-node-prep", "usr/share/doc/kmod/copyright", "usr/share/doc/dash/copyright"} {
		if !files[want] {
			t.Errorf("the nftables image lacks %s", want)
		}
	}
	for f := range files {
		if strings.Contains(f, "iptables") || strings.Contains(f, "ipset") || strings.Contains(f, "ipvsadm") || strings.Contains(f, "alternatives") {
			t.Errorf("the nftables image has %s", f)
		}
	}
}

// tarNames lists a tar stream's entry names.
func tarNames(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}
