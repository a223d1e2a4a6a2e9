package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"
)

// Tree is a filesystem being assembled for one layer: clean relative
// paths ("usr/bin/dash") to entries. Its tar is a function of its
// contents alone, so the same inputs give the same layer digest.
type Tree struct {
	entries map[string]*File
}

func newTree() *Tree { return &Tree{entries: map[string]*File{}} }

// usrMerged maps a package's /bin, /sbin and /lib* paths under /usr, as
// Debian's merged-/usr systems (and its bookworm images) lay them out;
// the top-level names are symlinks (see addUsrMergeLinks).
func usrMerged(p string) string {
	first, _, _ := strings.Cut(p, "/")
	switch first {
	case "bin", "sbin", "lib", "lib32", "lib64", "libx32":
		return "usr/" + p
	}
	return p
}

// dropped is what Debian's slim images leave out (dpkg path-exclude):
// manuals, info, translations and docs, but not the copyright files.
func dropped(p string) bool {
	for _, dir := range []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/linda", "usr/share/groff"} {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(p, "usr/share/doc/"); ok {
		_, file, _ := strings.Cut(rest, "/")
		return file != "copyright"
	}
	return false
}

// addDeb adds a package's files. Hard links become copies: a sorted tar
// could list a link before its target.
func (t *Tree) addDeb(name string, d *Deb) error {
	byPath := map[string]*File{}
	for i := range d.Files {
		f := d.Files[i]
		p := usrMerged(path.Clean(strings.TrimPrefix(f.Header.Name, "./")))
		if p == "." || dropped(p) {
			continue
		}
		switch f.Header.Typeflag {
		case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		case tar.TypeLink:
			target := byPath[usrMerged(path.Clean(strings.TrimPrefix(f.Header.Linkname, "./")))]
			if target == nil {
				return fmt.Errorf("%s: hard link %s to %s, which the package does not have first", name, p, f.Header.Linkname)
			}
			f.Header.Typeflag, f.Header.Linkname, f.Header.Mode, f.Data = tar.TypeReg, "", target.Header.Mode, target.Data
		default:
			return fmt.Errorf("%s: %s: unsupported tar entry type %q", name, p, f.Header.Typeflag)
		}
		if err := t.add(p, f.Header.Typeflag, f.Header.Mode, f.Header.Linkname, f.Data); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		byPath[p] = t.entries[p]
	}
	return nil
}

func (t *Tree) dir(p string, mode int64) error { return t.add(p, tar.TypeDir, mode, "", nil) }

func (t *Tree) file(p string, mode int64, data []byte) error {
	return t.add(p, tar.TypeReg, mode, "", data)
}

func (t *Tree) symlink(p, target string) error { return t.add(p, tar.TypeSymlink, 0o777, target, nil) }

// add records one entry, creating missing parents (0755); mode is the
// Unix permission bits (setuid, setgid and sticky included), as tar has them. The same path
// twice is fine only if both agree: two packages shipping one file with
// different contents is an error, not a silent pick.
func (t *Tree) add(p string, typ byte, mode int64, link string, data []byte) error {
	if p == "" || p == "." || strings.HasPrefix(p, "/") || strings.HasPrefix(p, "..") {
		return fmt.Errorf("bad path %q", p)
	}
	if parent := path.Dir(p); parent != "." {
		if old, ok := t.entries[parent]; !ok {
			if err := t.dir(parent, 0o755); err != nil {
				return err
			}
		} else if old.Header.Typeflag != tar.TypeDir {
			return fmt.Errorf("%s: parent %s is not a directory", p, parent)
		}
	}
	if typ == tar.TypeSymlink {
		mode = 0o777 // a link's own mode means nothing; keep every tar alike
	}
	h := tar.Header{Name: p, Typeflag: typ, Mode: mode & 0o7777, Linkname: link, Size: int64(len(data))}
	if old, ok := t.entries[p]; ok {
		if old.Header.Typeflag != typ || old.Header.Linkname != link || !bytes.Equal(old.Data, data) {
			return fmt.Errorf("%s is shipped twice with different contents", p)
		}
		return nil
	}
	t.entries[p] = &File{Header: h, Data: data}
	return nil
}

// has reports whether p exists (as anything).
func (t *Tree) has(p string) bool { _, ok := t.entries[p]; return ok }

// tar writes the tree sorted by path, every entry owned by root with
// mtime epoch: nothing of the build machine or the build time leaks in.
func (t *Tree) tar(epoch time.Time) ([]byte, error) {
	paths := make([]string, 0, len(t.entries))
	for p := range t.entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := t.entries[p]
		h := e.Header
		h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname = epoch, 0, 0, "root", "root"
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", p, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
