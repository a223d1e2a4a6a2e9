package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// Roots are the Debian packages the image is built from, the Dockerfile's
// list: iptables (legacy and nft), ipset, ipvsadm, conntrack, kmod (the
// node-prep init container's modprobe) and iproute2 (`ip addr show
// kube-ipvs0` in the pod); dash, grep and coreutils for the two shell
// scripts (node-prep, the iptables wrapper) and an operator's shell;
// base-files for /etc/os-release, which scanners read.
var Roots = []string{"base-files", "conntrack", "coreutils", "dash", "grep", "iproute2", "ipset", "iptables", "ipvsadm", "kmod"}

// Excluded are dependencies only maintainer scripts or init scripts use;
// nothing in the image runs those (the rootfs is assembled, not
// installed), and they would pull in perl and dpkg.
var Excluded = map[string]string{
	"awk":          "base-files' maintainer scripts",
	"debconf":      "iproute2's maintainer scripts",
	"debconf-2.0":  "iproute2's maintainer scripts",
	"debianutils":  "dash's maintainer scripts (add-shell)",
	"dpkg":         "maintainer scripts",
	"install-info": "grep's maintainer scripts",
	"lsb-base":     "ipvsadm's init script",
}

// Pin is one locked package for one architecture: enough to download it
// from any mirror of the suite and to refuse anything else.
type Pin struct {
	Arch     string
	Name     string
	Version  string
	Suite    string
	Filename string // relative to the archive root, as the index gives it
	SHA256   string
	Size     int64
}

func (p Pin) String() string {
	return fmt.Sprintf("%s %s %s %s %s %s %d", p.Arch, p.Name, p.Version, p.Suite, p.Filename, p.SHA256, p.Size)
}

// readLock parses a lock file: comment lines and one Pin per line.
func readLock(r io.Reader) ([]Pin, error) {
	var out []Pin
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 7 {
			return nil, fmt.Errorf("lock line %d: want 7 fields (arch name version suite filename sha256 size), got %d", n, len(f))
		}
		size, err := strconv.ParseInt(f[6], 10, 64)
		if err != nil || len(f[5]) != 64 {
			return nil, fmt.Errorf("lock line %d: bad sha256 or size", n)
		}
		out = append(out, Pin{Arch: f[0], Name: f[1], Version: f[2], Suite: f[3], Filename: f[4], SHA256: f[5], Size: size})
	}
	return out, sc.Err()
}

func writeLock(w io.Writer, pins []Pin) error {
	sort.Slice(pins, func(i, j int) bool {
		if pins[i].Arch != pins[j].Arch {
			return pins[i].Arch < pins[j].Arch
		}
		return pins[i].Name < pins[j].Name
	})
	fmt.Fprintf(w, "# The image's Debian packages (deploy/image; `make image-lock` rewrites this).\n")
	fmt.Fprintf(w, "# arch package version suite filename sha256 size\n")
	for _, p := range pins {
		if _, err := fmt.Fprintln(w, p); err != nil {
			return err
		}
	}
	return nil
}

// indexEntry is a package as the merged index of all suites offers it.
type indexEntry struct {
	Paragraph
	Suite string
}

// resolve walks Depends and Pre-Depends from roots through index,
// skipping Excluded, and returns every package needed, sorted by name.
// For "a | b" it takes the first alternative the index has.
func resolve(index map[string]indexEntry, roots []string) ([]string, error) {
	seen := map[string]bool{}
	queue := append([]string(nil), roots...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if seen[name] {
			continue
		}
		e, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("package %s is not in the index", name)
		}
		seen[name] = true
		for _, field := range []string{e.Paragraph["Pre-Depends"], e.Paragraph["Depends"]} {
			for _, alts := range depNames(field) {
				pick, excluded := pickDependency(alts, func(a string) bool { _, ok := index[a]; return ok })
				switch {
				case excluded:
				case pick == "":
					return nil, fmt.Errorf("%s depends on %s, which the index does not have: add it to Excluded if nothing at run time needs it", name, strings.Join(alts, " | "))
				default:
					queue = append(queue, pick)
				}
			}
		}
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// mergeIndex adds a suite's packages to index, keeping the newest
// version of each.
func mergeIndex(index map[string]indexEntry, suite string, ps []Paragraph) {
	for _, p := range ps {
		name := p["Package"]
		if old, ok := index[name]; ok && compareVersions(old.Paragraph["Version"], p["Version"]) >= 0 {
			continue
		}
		index[name] = indexEntry{Paragraph: p, Suite: suite}
	}
}

// pinsFor turns the resolved names into pins.
func pinsFor(arch string, index map[string]indexEntry, names []string) ([]Pin, error) {
	var out []Pin
	for _, n := range names {
		e := index[n]
		size, err := strconv.ParseInt(e.Paragraph["Size"], 10, 64)
		if err != nil || len(e.Paragraph["SHA256"]) != 64 || e.Paragraph["Filename"] == "" {
			return nil, fmt.Errorf("%s (%s): index entry lacks Filename, SHA256 or Size", n, arch)
		}
		out = append(out, Pin{Arch: arch, Name: n, Version: e.Paragraph["Version"], Suite: e.Suite,
			Filename: e.Paragraph["Filename"], SHA256: e.Paragraph["SHA256"], Size: size})
	}
	return out, nil
}

// fetchIndex downloads one suite's Packages index for arch, verified:
// InRelease's signature by gpgv against the source's keyring, then the
// index's SHA256 against InRelease.
func fetchIndex(src Source, arch string, get func(string) ([]byte, error)) ([]Paragraph, error) {
	base := src.URI + "/dists/" + src.Suite
	signed, err := get(base + "/InRelease")
	if err != nil {
		return nil, err
	}
	release, err := verifyInRelease(signed, src.Keyring)
	if err != nil {
		return nil, fmt.Errorf("%s InRelease: %w", src.Suite, err)
	}
	name := "main/binary-" + arch + "/Packages.xz"
	want := releaseSHA256(release, name)
	if want == "" {
		return nil, fmt.Errorf("%s InRelease lists no SHA256 for %s", src.Suite, name)
	}
	data, err := get(base + "/" + name)
	if err != nil {
		return nil, err
	}
	if got := sha256Hex(data); got != want {
		return nil, fmt.Errorf("%s %s: sha256 %s, InRelease says %s", src.Suite, name, got, want)
	}
	xr, err := xz.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", src.Suite, name, err)
	}
	return parseParagraphs(xr)
}

// verifyInRelease checks the clearsigned Release file with gpgv and
// returns the signed text only.
func verifyInRelease(signed []byte, keyring string) ([]byte, error) {
	if keyring == "" {
		keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
	}
	if _, err := os.Stat(keyring); err != nil {
		return nil, fmt.Errorf("keyring: %w (install debian-archive-keyring)", err)
	}
	cmd := exec.Command("gpgv", "--keyring", keyring, "--output", "-", "-")
	cmd.Stdin = bytes.NewReader(signed)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("gpgv: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// releaseSHA256 finds name in a Release file's SHA256 section.
func releaseSHA256(release []byte, name string) string {
	in := false
	for _, line := range strings.Split(string(release), "\n") {
		if !strings.HasPrefix(line, " ") {
			in = strings.HasPrefix(line, "SHA256:")
			continue
		}
		if f := strings.Fields(line); in && len(f) == 3 && f[2] == name {
			return f[0]
		}
	}
	return ""
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// pickDependency is the alternative of a dependency ("a | b") that goes
// in: the first one has reports, unless an Excluded one comes before it
// (then nothing goes in: excluded); "" when there is none.
func pickDependency(alts []string, has func(string) bool) (pick string, excluded bool) {
	for _, a := range alts {
		if _, ex := Excluded[a]; ex {
			return "", true
		}
		if has(a) {
			return a, false
		}
	}
	return "", false
}
