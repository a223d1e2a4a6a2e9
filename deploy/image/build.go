package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// downloader fetches locked .debs into a cache keyed by sha256, so a warm
// build reads no network and needs no apt configuration.
type downloader struct {
	cache       string
	sourceFiles []string
	get         func(url string) ([]byte, error)
	sources     map[string]string // suite to archive URI, read on first miss
}

// deb returns the package's bytes, verified against the lock.
func (d *downloader) deb(p Pin) ([]byte, error) {
	path := filepath.Join(d.cache, "debs", p.SHA256+".deb")
	if data, err := os.ReadFile(path); err == nil && sha256Hex(data) == p.SHA256 {
		return data, nil
	}
	if d.sources == nil {
		srcs, err := readSources(d.sourceFiles, "bookworm")
		if err != nil {
			return nil, err
		}
		d.sources = map[string]string{}
		for _, s := range srcs {
			d.sources[s.Suite] = s.URI
		}
	}
	uri, ok := d.sources[p.Suite]
	if !ok {
		return nil, fmt.Errorf("%s %s: no apt source for suite %s", p.Name, p.Arch, p.Suite)
	}
	data, err := d.get(uri + "/" + p.Filename)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w (if the mirror dropped this version, run `make image-lock`)", p.Name, p.Version, err)
	}
	if got := sha256Hex(data); got != p.SHA256 || int64(len(data)) != p.Size {
		return nil, fmt.Errorf("%s %s: downloaded sha256 %s (%d bytes), the lock says %s (%d bytes)", p.Name, p.Version, got, len(data), p.SHA256, p.Size)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return nil, err
	}
	return data, os.Rename(tmp, path)
}

// unpacked returns the package read, from the plain copy in the cache
// when there is one (written from the verified original; the cache is
// as trusted as the originals in it).
func (d *downloader) unpacked(p Pin) (*Deb, error) {
	data, err := d.deb(p)
	if err != nil {
		return nil, err
	}
	plainPath := filepath.Join(d.cache, "debs", p.SHA256+".plain")
	if plain, err := os.ReadFile(plainPath); err == nil {
		if deb, err := readDeb(bytes.NewReader(plain)); err == nil {
			return deb, nil
		}
	}
	deb, err := readDeb(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s %s (%s): %w", p.Name, p.Version, p.Arch, err)
	}
	if err := os.WriteFile(plainPath+".tmp", deb.plain(), 0o644); err == nil {
		os.Rename(plainPath+".tmp", plainPath)
	}
	return deb, nil
}

// build assembles the variant's index: one image per architecture that
// has a binary, each from the pins of that architecture the variant
// selects.
func build(pins []Pin, binaries map[string]string, common AppFiles, dl *downloader, m Meta, v Variant) (v1.ImageIndex, error) {
	arches := sortedKeys(binaries)
	if len(arches) == 0 {
		return nil, fmt.Errorf("no --binary given")
	}
	var imgs []v1.Image
	for _, arch := range arches {
		selected, err := selectPins(pins, arch, v, func(p Pin) (Paragraph, error) {
			d, err := dl.unpacked(p)
			if err != nil {
				return nil, err
			}
			return d.Control, nil
		})
		if err != nil {
			return nil, err
		}
		roots := Roots
		if v.Roots != nil {
			roots = v.Roots
		}
		debs := map[string]*Deb{}
		for _, p := range selected {
			d, err := dl.unpacked(p)
			if err != nil {
				return nil, err
			}
			debs[p.Name] = d
		}
		for _, r := range roots {
			if debs[r] == nil {
				return nil, fmt.Errorf("the lock has no %s for %s: run `make image-lock`", r, arch)
			}
		}
		base, err := baseTree(debs, v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", arch, err)
		}
		app := common
		if app.Binary, err = os.ReadFile(binaries[arch]); err != nil {
			return nil, err
		}
		tree, err := appTree(app, v)
		if err != nil {
			return nil, err
		}
		img, err := archImage(arch, base, tree, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", arch, err)
		}
		imgs = append(imgs, img)
	}
	return imageIndex(arches, imgs, m)
}
