package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// A .deb is an ar archive: debian-binary, control.tar.*, data.tar.*.
// Bookworm compresses both tars with xz; gzip and none are accepted too.

// debMembers calls fn for each member of the ar archive in r.
func debMembers(r io.Reader, fn func(name string, body io.Reader) error) error {
	br := bufio.NewReader(r)
	magic := make([]byte, 8)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "!<arch>\n" {
		return fmt.Errorf("not a .deb (ar) archive")
	}
	hdr := make([]byte, 60)
	for {
		if _, err := io.ReadFull(br, hdr); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("ar header: %w", err)
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil || size < 0 {
			return fmt.Errorf("ar member %q: bad size", name)
		}
		body := io.LimitReader(br, size)
		if err := fn(name, body); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if _, err := io.Copy(io.Discard, body); err != nil {
			return err
		}
		if size%2 == 1 { // members are 2-byte aligned
			if _, err := br.ReadByte(); err != nil && err != io.EOF {
				return err
			}
		}
	}
}

// decompressed opens a member by its name's suffix.
func decompressed(name string, r io.Reader) (io.Reader, error) {
	switch {
	case strings.HasSuffix(name, ".tar.xz"):
		return xz.NewReader(r)
	case strings.HasSuffix(name, ".tar.gz"):
		return gzip.NewReader(r)
	case strings.HasSuffix(name, ".tar"):
		return r, nil
	}
	return nil, fmt.Errorf("unsupported compression (this builder reads xz, gzip or none)")
}

// Deb is what the image needs of a package: its control stanza (for the
// dpkg status file scanners read) and its files.
type Deb struct {
	Control Paragraph
	Files   []File

	controlTar, dataTar []byte // uncompressed, for plain
}

// File is one tar entry of a package's data.tar, its content read.
type File struct {
	Header tar.Header
	Data   []byte
}

// readDeb reads a whole .deb.
func readDeb(r io.Reader) (*Deb, error) {
	var controlTar, dataTar []byte
	err := debMembers(r, func(name string, body io.Reader) error {
		if !strings.HasPrefix(name, "control.tar") && !strings.HasPrefix(name, "data.tar") {
			return nil
		}
		tr, err := decompressed(name, body)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if strings.HasPrefix(name, "control.tar") {
			controlTar = b
		} else {
			dataTar = b
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return parseDeb(controlTar, dataTar)
}

// parseDeb reads a package's two uncompressed tars.
func parseDeb(controlTar, dataTar []byte) (*Deb, error) {
	d := &Deb{}
	err := eachTar(bytes.NewReader(controlTar), func(h *tar.Header, data []byte) error {
		if strings.TrimPrefix(h.Name, "./") != "control" {
			return nil
		}
		ps, err := parseParagraphs(bytes.NewReader(data))
		if err != nil || len(ps) != 1 {
			return fmt.Errorf("control file: want one stanza (%v)", err)
		}
		d.Control = ps[0]
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("control.tar: %w", err)
	}
	if d.Control == nil {
		return nil, fmt.Errorf("no control file")
	}
	err = eachTar(bytes.NewReader(dataTar), func(h *tar.Header, data []byte) error {
		d.Files = append(d.Files, File{Header: *h, Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("data.tar: %w", err)
	}
	d.controlTar, d.dataTar = controlTar, dataTar
	return d, nil
}

// plain is the package as a .deb with uncompressed members: the build
// cache keeps it beside the original, since decoding xz in Go is most of
// a warm build's time.
func (d *Deb) plain() []byte {
	var b bytes.Buffer
	b.WriteString("!<arch>\n")
	for _, m := range []struct {
		name string
		body []byte
	}{{"debian-binary", []byte("2.0\n")}, {"control.tar", d.controlTar}, {"data.tar", d.dataTar}} {
		fmt.Fprintf(&b, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", m.name, 0, 0, 0, "100644", len(m.body))
		b.Write(m.body)
		if len(m.body)%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func eachTar(r io.Reader, fn func(*tar.Header, []byte) error) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if err := fn(h, data); err != nil {
			return err
		}
	}
}
