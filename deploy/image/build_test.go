package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/ulikunitz/xz"
)

// entry is one file of a synthetic package.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	data       string
}

func tarXZ(t *testing.T, entries []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	xw, err := xz.NewWriter(&b)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(xw)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.data)),
			Uid: 1000, Uname: "builder", ModTime: time.Now()}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.data))
		}
	}
	tw.Close()
	xw.Close()
	return b.Bytes()
}

// makeDeb builds a .deb as dpkg-deb does: ar of debian-binary,
// control.tar.xz and data.tar.xz.
func makeDeb(t *testing.T, name, version string, files []entry) []byte {
	t.Helper()
	control := tarXZ(t, []entry{{name: "./control", typ: tar.TypeReg, mode: 0o644,
		data: fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: amd64\nDescription: test\n more text\n", name, version)}})
	data := tarXZ(t, files)
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for _, m := range []struct {
		name string
		body []byte
	}{{"debian-binary", []byte("2.0\n")}, {"control.tar.xz", control}, {"data.tar.xz", data}} {
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m.name, 0, 0, 0, "100644", len(m.body))
		b.Write(m.body)
		if len(m.body)%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func reg(name string, mode int64, data string) entry {
	return entry{name: name, typ: tar.TypeReg, mode: mode, data: data}
}

func TestReadDebUsrMergesAndDropsDocs(t *testing.T) {
	raw := makeDeb(t, "tool", "1.0-1", []entry{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		reg("./bin/tool", 0o4755, "#!/bin/sh\n"),
		{name: "./bin/tool-again", typ: tar.TypeLink, link: "./bin/tool"},
		{name: "./sbin/t", typ: tar.TypeSymlink, link: "../bin/tool"},
		reg("./lib/x86_64-linux-gnu/libtool.so.1", 0o644, "ELF"),
		reg("./usr/share/doc/tool/copyright", 0o644, "GPL"),
		reg("./usr/share/doc/tool/changelog.gz", 0o644, "log"),
		reg("./usr/share/man/man1/tool.1.gz", 0o644, "man"),
	})
	d, err := readDeb(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if d.Control["Package"] != "tool" || d.Control["Description"] != "test\n more text" {
		t.Errorf("control = %v", d.Control)
	}
	tr := newTree()
	if err := tr.addDeb("tool", d); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for p, f := range tr.entries {
		got[p] = fmt.Sprintf("%c %o %s%s", f.Header.Typeflag, f.Header.Mode, f.Header.Linkname, f.Data)
	}
	want := map[string]string{
		"usr":                                   "5 755 ",
		"usr/bin":                               "5 755 ",
		"usr/bin/tool":                          "0 4755 #!/bin/sh\n",
		"usr/bin/tool-again":                    "0 4755 #!/bin/sh\n", // a hard link, copied
		"usr/sbin":                              "5 755 ",
		"usr/sbin/t":                            "2 777 ../bin/tool",
		"usr/lib":                               "5 755 ",
		"usr/lib/x86_64-linux-gnu":              "5 755 ",
		"usr/lib/x86_64-linux-gnu/libtool.so.1": "0 644 ELF",
		"usr/share":                             "5 755 ",
		"usr/share/doc":                         "5 755 ",
		"usr/share/doc/tool":                    "5 755 ",
		"usr/share/doc/tool/copyright":          "0 644 GPL",
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: got %q, want %q", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected %s", p)
		}
	}
}

func TestTreeRefusesConflictingFiles(t *testing.T) {
	tr := newTree()
	if err := tr.file("etc/x", 0o644, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if err := tr.file("etc/x", 0o644, []byte("a")); err != nil {
		t.Errorf("the same file twice: %v", err)
	}
	if err := tr.file("etc/x", 0o644, []byte("b")); err == nil || !strings.Contains(err.Error(), "etc/x") {
		t.Errorf("different contents: err = %v", err)
	}
	if err := tr.file("etc/x/y", 0o644, nil); err == nil {
		t.Error("a file under a file was accepted")
	}
}

func TestTarIsSortedOwnedByRootWithOneMtime(t *testing.T) {
	tr := newTree()
	tr.file("usr/bin/b", 0o755, []byte("b"))
	tr.file("usr/bin-x/a", 0o644, []byte("a"))
	tr.symlink("bin", "usr/bin")
	epoch := time.Unix(1700000000, 0)
	data, err := tr.tar(epoch)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	r := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: uid %d gid %d mtime %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
	}
	// Byte order of the paths: every parent before its children.
	want := "bin usr/ usr/bin/ usr/bin-x/ usr/bin-x/a usr/bin/b"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("order %q, want %q", got, want)
	}
}

// fakeRoots builds, for every root package, a tiny .deb; iptables
// carries the nft names the alternatives point at. It returns the lock
// and a cache already holding the packages.
func fakeRoots(t *testing.T) ([]Pin, string) {
	t.Helper()
	cache := t.TempDir()
	os.MkdirAll(filepath.Join(cache, "debs"), 0o755)
	var pins []Pin
	for _, name := range Roots {
		files := []entry{reg("./usr/share/doc/"+name+"/copyright", 0o644, name)}
		if name == "iptables" {
			files = append(files, reg("./usr/sbin/xtables-nft-multi", 0o755, "ELF"))
			for _, c := range []string{"iptables", "ip6tables", "arptables", "ebtables"} {
				for _, s := range []string{"", "-save", "-restore"} {
					files = append(files, entry{name: "./usr/sbin/" + c + "-nft" + s, typ: tar.TypeSymlink, link: "xtables-nft-multi"})
				}
			}
		}
		raw := makeDeb(t, name, "1.0", files)
		sum := sha256Hex(raw)
		os.WriteFile(filepath.Join(cache, "debs", sum+".deb"), raw, 0o644)
		pins = append(pins, Pin{Arch: "amd64", Name: name, Version: "1.0", Suite: "bookworm", Filename: "pool/" + name + ".deb", SHA256: sum, Size: int64(len(raw))})
	}
	return pins, cache
}

func buildDigest(t *testing.T, pins []Pin, cache, binary string, m Meta) string {
	t.Helper()
	dl := &downloader{cache: cache, get: func(url string) ([]byte, error) {
		return nil, fmt.Errorf("no network in this test: %s", url)
	}}
	idx, err := build(pins, map[string]string{"amd64": binary}, AppFiles{NodePrep: []byte("#!/bin/sh\n"), IptablesWrapper: []byte("#!/bin/sh\n")}, dl, m, Variants[0])
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image")
	if err := writeLayout(out, idx, m.Ref); err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	man, err := top.IndexManifest()
	if err != nil || len(man.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d entries", err, len(man.Manifests))
	}
	if got := man.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != "v9.9.9" {
		t.Errorf("ref.name = %q, want the tag v9.9.9", got)
	}
	d, _ := idx.Digest()
	if man.Manifests[0].Digest != d {
		t.Errorf("index.json names %s, the build returned %s", man.Manifests[0].Digest, d)
	}
	return d.String()
}

func TestBuildIsReproducible(t *testing.T) {
	pins, cache := fakeRoots(t)
	bin := filepath.Join(t.TempDir(), "ipvsproxy")
	os.WriteFile(bin, []byte("binary"), 0o755)
	m := Meta{Ref: "registry.invalid/ipvsproxy:v9.9.9", Version: "v9.9.9", Revision: "abc", Epoch: time.Unix(1700000000, 0)}
	first := buildDigest(t, pins, cache, bin, m)
	os.Chtimes(bin, time.Now(), time.Now()) // the file's own time must not matter
	if again := buildDigest(t, pins, cache, bin, m); again != first {
		t.Errorf("two builds: %s then %s", first, again)
	}
	m.Epoch = m.Epoch.Add(time.Second)
	if other := buildDigest(t, pins, cache, bin, m); other == first {
		t.Error("a different SOURCE_DATE_EPOCH gave the same digest: the timestamps are not in the image")
	}
}

func TestBuildRefusesAPackageThatDoesNotMatchTheLock(t *testing.T) {
	pins, cache := fakeRoots(t)
	corrupt := filepath.Join(cache, "debs", pins[0].SHA256+".deb")
	os.WriteFile(corrupt, []byte("tampered"), 0o644)
	dl := &downloader{cache: cache, sourceFiles: []string{writeSources(t)}, get: func(string) ([]byte, error) {
		return []byte("still tampered"), nil
	}}
	_, err := dl.deb(pins[0])
	if err == nil || !strings.Contains(err.Error(), "the lock says") {
		t.Errorf("err = %v, want a sha256 mismatch", err)
	}
}

func writeSources(t *testing.T) string {
	f := filepath.Join(t.TempDir(), "s.sources")
	os.WriteFile(f, []byte("Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm\nComponents: main\n"), 0o644)
	return f
}
