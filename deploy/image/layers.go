package main

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// The image's two layers per architecture: the Debian userspace (changes
// only with the lock, so an upgrade pushes and pulls the app layer alone)
// and ipvsproxy with its two scripts.

// baseTree assembles the Debian userspace from the locked packages, in
// the layout the Dockerfile's debian:bookworm-slim image has for them.
func baseTree(debs map[string]*Deb, v Variant) (*Tree, error) {
	t := newTree()
	names := make([]string, 0, len(debs))
	for n := range debs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := t.addDeb(n, debs[n]); err != nil {
			return nil, err
		}
	}
	if err := addUsrMergeLinks(t); err != nil {
		return nil, err
	}
	if v.IPTables {
		if err := addAlternatives(t); err != nil {
			return nil, err
		}
	}
	if err := addSystemFiles(t); err != nil {
		return nil, err
	}
	if err := t.file("var/lib/dpkg/status", 0o644, dpkgStatus(debs, names)); err != nil {
		return nil, err
	}
	return t, nil
}

// addUsrMergeLinks makes /bin, /sbin and /lib* the symlinks into /usr a
// merged-/usr Debian has; the ELF interpreter (/lib64/ld-linux-x86-64.so.2,
// /lib/ld-linux-aarch64.so.1) and #!/bin/sh are found through them.
func addUsrMergeLinks(t *Tree) error {
	for _, d := range []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"} {
		if t.has("usr/" + d) {
			if err := t.symlink(d, "usr/"+d); err != nil {
				return err
			}
		}
	}
	return nil
}

// addAlternatives does what iptables' postinst does with
// update-alternatives on Debian: iptables, ip6tables, arptables and
// ebtables (each with -save and -restore) point at the nft variants,
// bookworm's default (priority 20 over legacy's 10). The wrapper in
// /usr/local/sbin comes first on the PATH, as in the Dockerfile's image.
func addAlternatives(t *Tree) error {
	for _, cmd := range []string{"iptables", "ip6tables", "arptables", "ebtables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			name := cmd + suffix
			target := "/usr/sbin/" + cmd + "-nft" + suffix
			if !t.has(strings.TrimPrefix(target, "/")) {
				return fmt.Errorf("alternative %s: %s is not in the packages", name, target)
			}
			if err := t.symlink("etc/alternatives/"+name, target); err != nil {
				return err
			}
			if err := t.symlink("usr/sbin/"+name, "/etc/alternatives/"+name); err != nil {
				return err
			}
		}
	}
	return nil
}

// addSystemFiles adds what a Debian system has from packages the image
// leaves out (base-passwd) or from the installer: accounts, writable
// temporary directories, root's home.
func addSystemFiles(t *Tree) error {
	files := []struct {
		path string
		data string
	}{
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
		{"etc/group", "root:x:0:\nnogroup:x:65534:\n"},
	}
	for _, f := range files {
		if err := t.file(f.path, 0o644, []byte(f.data)); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		path string
		mode int64
	}{{"tmp", 0o1777}, {"var/tmp", 0o1777}, {"root", 0o700}, {"run", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}} {
		if t.has(d.path) {
			continue
		}
		if err := t.dir(d.path, d.mode); err != nil {
			return err
		}
	}
	return nil
}

// statusFieldOrder is dpkg's own order for the status file; other fields
// follow sorted.
var statusFieldOrder = []string{"Package", "Status", "Priority", "Section", "Installed-Size", "Maintainer",
	"Architecture", "Multi-Arch", "Source", "Version", "Replaces", "Provides", "Pre-Depends", "Depends",
	"Recommends", "Suggests", "Breaks", "Conflicts", "Conffiles", "Description", "Homepage"}

// dpkgStatus is /var/lib/dpkg/status for the installed packages, so
// image scanners (which read it) see exactly what is in the image.
func dpkgStatus(debs map[string]*Deb, names []string) []byte {
	var b bytes.Buffer
	for _, n := range names {
		p := Paragraph{}
		for k, v := range debs[n].Control {
			p[k] = v
		}
		p["Status"] = "install ok installed"
		seen := map[string]bool{}
		for _, k := range statusFieldOrder {
			if v, ok := p[k]; ok {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
				seen[k] = true
			}
		}
		var rest []string
		for k := range p {
			if !seen[k] {
				rest = append(rest, k)
			}
		}
		sort.Strings(rest)
		for _, k := range rest {
			fmt.Fprintf(&b, "%s: %s\n", k, p[k])
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

// AppFiles are the files of the app layer, read by the caller.
type AppFiles struct {
	Binary          []byte // ipvsproxy, static, for this architecture
	NodePrep        []byte // deploy/node-prep.sh
	IptablesWrapper []byte // deploy/iptables-wrapper.sh
}

// appTree lays out ipvsproxy as the Dockerfile does: the binary and
// node-prep in /usr/local/bin, the iptables wrapper in /usr/local/sbin
// under every name an operator types (only in a variant with iptables).
func appTree(a AppFiles, v Variant) (*Tree, error) {
	t := newTree()
	if err := t.file("usr/local/bin/ipvsproxy", 0o755, a.Binary); err != nil {
		return nil, err
	}
	if err := t.file("usr/local/bin/ipvsproxy-node-prep", 0o755, a.NodePrep); err != nil {
		return nil, err
	}
	if !v.IPTables {
		return t, nil
	}
	if err := t.file("usr/local/sbin/iptables-wrapper", 0o755, a.IptablesWrapper); err != nil {
		return nil, err
	}
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			if err := t.symlink("usr/local/sbin/"+cmd+suffix, "iptables-wrapper"); err != nil {
				return nil, err
			}
		}
	}
	return t, nil
}
