package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Meta is what the image says about itself.
type Meta struct {
	Ref      string // full reference, registry/repo:tag, as deploy/ names it
	Version  string
	Revision string
	Epoch    time.Time // SOURCE_DATE_EPOCH: every timestamp in the image
	// Description is the variant's, if it has one (the default image has
	// none).
	Description string
	// IPTables: the app layer holds the iptables wrapper.
	IPTables bool
}

// Env is the Debian image's PATH; /usr/local/sbin first, so the wrapper
// answers `iptables-save` in the pod.
var Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// layerOf turns a tar into an OCI gzip layer. It compresses once, here
// (go-containerregistry would compress again for each digest and write);
// compress/gzip writes no timestamp or name in the header, so the same
// tar gives the same digest.
func layerOf(tarData []byte) (v1.Layer, error) {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarData); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := b.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// archImage builds one architecture's image from its two layers.
func archImage(arch string, base, app *Tree, m Meta) (v1.Image, error) {
	var adds []mutate.Addendum
	for _, l := range []struct {
		tree    *Tree
		comment string
	}{
		{base, "Debian bookworm userspace: deploy/image/packages.lock"},
		{app, appComment(m)},
	} {
		data, err := l.tree.tar(m.Epoch)
		if err != nil {
			return nil, err
		}
		layer, err := layerOf(data)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: m.Epoch}, CreatedBy: "deploy/image", Comment: l.comment}})
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: m.Epoch},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: []string{"/usr/local/bin/ipvsproxy"},
			Env:        Env,
			Labels:     labels(m),
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Append(img, adds...)
}

func appComment(m Meta) string {
	if m.IPTables {
		return "ipvsproxy " + m.Version + ", node-prep, iptables-wrapper"
	}
	return "ipvsproxy " + m.Version + ", node-prep"
}

func labels(m Meta) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":    "ipvsproxy",
		"org.opencontainers.image.version":  m.Version,
		"org.opencontainers.image.revision": m.Revision,
		"org.opencontainers.image.created":  m.Epoch.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	if m.Description != "" {
		l["org.opencontainers.image.description"] = m.Description
	}
	return l
}

// imageIndex joins the per-architecture images (in the order given).
func imageIndex(arches []string, imgs []v1.Image, m Meta) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for i, img := range imgs {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arches[i]}}})
	}
	annotated, ok := mutate.Annotations(idx, labels(m)).(v1.ImageIndex)
	if !ok {
		return nil, fmt.Errorf("annotating the index: unexpected type")
	}
	return annotated, nil
}

// writeLayout writes idx as an OCI image layout at dir, replacing what
// was there. index.json names it as BuildKit's OCI exporter does: the
// tag in org.opencontainers.image.ref.name (`skopeo copy oci:DIR:TAG`),
// the full reference in io.containerd.image.name (`ctr import`, `docker
// load` of the layout's tar).
func writeLayout(dir string, idx v1.ImageIndex, ref string) error {
	tag := ref[strings.LastIndex(ref, ":")+1:]
	if i := strings.LastIndex(ref, ":"); i < 0 || strings.Contains(tag, "/") {
		return fmt.Errorf("image reference %q has no tag", ref)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".image-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	p, err := layout.Write(tmp, empty.Index)
	if err != nil {
		return err
	}
	err = p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          ref,
	}))
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp's 0700
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}
