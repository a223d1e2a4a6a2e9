package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestCompareVersionsOrdersAsDpkg(t *testing.T) {
	// Each is older than the next (dpkg --compare-versions lt).
	ordered := []string{
		"1.0~rc1", "1.0", "1.0-1", "1.0-1+b1", "1.0-1+deb12u1", "1.0-1+deb12u2", "1.0-1+deb12u10",
		"1.0a", "1.0+dfsg", "1.2", "1.10", "1:0.1", "2:0",
	}
	for i := 0; i+1 < len(ordered); i++ {
		a, b := ordered[i], ordered[i+1]
		if c := compareVersions(a, b); c != -1 {
			t.Errorf("compare(%s, %s) = %d, want -1", a, b, c)
		}
		if c := compareVersions(b, a); c != 1 {
			t.Errorf("compare(%s, %s) = %d, want 1", b, a, c)
		}
	}
	if c := compareVersions("1:1.01-1", "1:1.1-1"); c != 0 {
		t.Errorf("leading zeros: got %d, want 0", c)
	}
}

func TestDepNamesDropsConstraintsAndKeepsAlternatives(t *testing.T) {
	got := depNames("libc6 (>= 2.34), debconf (>= 0.5) | debconf-2.0, python3:any, libfoo [amd64]")
	want := [][]string{{"libc6"}, {"debconf", "debconf-2.0"}, {"python3"}, {"libfoo"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestReadSourcesFindsTheCodenamesMainSuites(t *testing.T) {
	dir := t.TempDir()
	deb822 := filepath.Join(dir, "debian.sources")
	os.WriteFile(deb822, []byte(`Types: deb
# a comment
URIs: http://mirror.invalid/debian/
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /k.gpg

Types: deb-src
URIs: http://mirror.invalid/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://mirror.invalid/debian
Suites: trixie
Components: main
`), 0o644)
	list := filepath.Join(dir, "sec.list")
	os.WriteFile(list, []byte("# deb http://old.invalid bookworm main\ndeb [arch=amd64 signed-by=/s.gpg] http://sec.invalid/debian-security bookworm-security main\ndeb http://other.invalid nodistro main\n"), 0o644)
	got, err := readSources([]string{deb822, list}, "bookworm")
	if err != nil {
		t.Fatal(err)
	}
	want := []Source{
		{URI: "http://mirror.invalid/debian", Suite: "bookworm", Keyring: "/k.gpg"},
		{URI: "http://sec.invalid/debian-security", Suite: "bookworm-security", Keyring: "/s.gpg"},
		{URI: "http://mirror.invalid/debian", Suite: "bookworm-updates", Keyring: "/k.gpg"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if _, err := readSources([]string{list}, "trixie"); err == nil || !strings.Contains(err.Error(), "--sources") {
		t.Errorf("no trixie source: err = %v, want one naming --sources", err)
	}
}

func index(entries ...string) map[string]indexEntry {
	idx := map[string]indexEntry{}
	for _, e := range entries {
		ps, err := parseParagraphs(strings.NewReader(e))
		if err != nil {
			panic(err)
		}
		mergeIndex(idx, "bookworm", ps)
	}
	return idx
}

func TestResolveFollowsDependsAndSkipsMaintainerScriptOnes(t *testing.T) {
	idx := index(
		"Package: tool\nVersion: 1\nDepends: libfoo (>= 1), debconf | debconf-2.0\nPre-Depends: libc6\n",
		"Package: libfoo\nVersion: 1\nDepends: missing-virtual | libbar, libc6\n",
		"Package: libbar\nVersion: 1\n",
		"Package: libc6\nVersion: 2.36\nDepends: libgcc-s1\n",
		"Package: libgcc-s1\nVersion: 12\nDepends: libc6\n",
		"Package: unrelated\nVersion: 1\n",
	)
	got, err := resolve(idx, []string{"tool"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"libbar", "libc6", "libfoo", "libgcc-s1", "tool"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	idx = index("Package: tool\nVersion: 1\nDepends: libgone\n")
	if _, err := resolve(idx, []string{"tool"}); err == nil || !strings.Contains(err.Error(), "libgone") {
		t.Errorf("missing dependency: err = %v, want one naming libgone", err)
	}
}

func TestMergeIndexKeepsTheNewestAcrossSuites(t *testing.T) {
	idx := map[string]indexEntry{}
	mergeIndex(idx, "bookworm", []Paragraph{{"Package": "libssl3", "Version": "3.0.15-1~deb12u1"}})
	mergeIndex(idx, "bookworm-security", []Paragraph{{"Package": "libssl3", "Version": "3.0.16-1~deb12u1"}})
	mergeIndex(idx, "bookworm-updates", []Paragraph{{"Package": "libssl3", "Version": "3.0.9-1"}})
	if e := idx["libssl3"]; e.Suite != "bookworm-security" || e.Paragraph["Version"] != "3.0.16-1~deb12u1" {
		t.Errorf("got %s from %s, want 3.0.16-1~deb12u1 from bookworm-security", e.Paragraph["Version"], e.Suite)
	}
}

func TestReleaseSHA256ReadsOnlyTheSHA256Section(t *testing.T) {
	rel := []byte("Origin: Debian\nMD5Sum:\n 0123 10 main/binary-amd64/Packages.xz\nSHA256:\n abcd 10 main/binary-arm64/Packages.xz\n beef 10 main/binary-amd64/Packages.xz\n")
	if got := releaseSHA256(rel, "main/binary-amd64/Packages.xz"); got != "beef" {
		t.Errorf("got %q, want beef", got)
	}
	if got := releaseSHA256(rel, "main/binary-s390x/Packages.xz"); got != "" {
		t.Errorf("absent file: got %q", got)
	}
}

func TestLockRoundTrips(t *testing.T) {
	pins := []Pin{
		{Arch: "arm64", Name: "dash", Version: "0.5.12-2", Suite: "bookworm", Filename: "pool/main/d/dash/dash_0.5.12-2_arm64.deb", SHA256: strings.Repeat("a", 64), Size: 9},
		{Arch: "amd64", Name: "libc6", Version: "2.36-9+deb12u14", Suite: "bookworm-security", Filename: "pool/x.deb", SHA256: strings.Repeat("b", 64), Size: 10},
	}
	var b bytes.Buffer
	if err := writeLock(&b, append([]Pin(nil), pins...)); err != nil {
		t.Fatal(err)
	}
	got, err := readLock(&b)
	if err != nil {
		t.Fatal(err)
	}
	want := []Pin{pins[1], pins[0]} // sorted by arch, then name
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if _, err := readLock(strings.NewReader("amd64 dash 1 bookworm f.deb short 9\n")); err == nil {
		t.Error("a bad sha256 was accepted")
	}
}

var debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// TestRootsCoverTheDockerfilesPackages keeps the two builds in step: a
// package the Dockerfile installs and the lock lacks would make the
// engine-free image quietly poorer.
func TestRootsCoverTheDockerfilesPackages(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var pkgs []string
	for _, line := range strings.Split(string(data), "\n") {
		if _, rest, ok := strings.Cut(line, "apt-get install"); ok {
			for _, w := range strings.Fields(rest) {
				if debName.MatchString(w) { // not a flag, && or \
					pkgs = append(pkgs, w)
				}
			}
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("found no apt-get install line in deploy/Dockerfile")
	}
	for _, p := range pkgs {
		if !slices.Contains(Roots, p) {
			t.Errorf("deploy/Dockerfile installs %s; deploy/image's Roots do not", p)
		}
	}
}
