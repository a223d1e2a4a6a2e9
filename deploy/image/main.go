// Command imagebuild assembles ipvsproxy's multi-arch OCI image without a
// container engine: `make image` runs it.
//
// It is a module of its own (deploy/image) so go-containerregistry and xz
// stay out of the product's go.mod and its vulnerability reports, as the
// e2e tools module keeps kube-apiserver's out.
//
//	imagebuild lock   resolve the Dockerfile's Debian packages and their
//	                  dependencies from the mirror apt uses here, for amd64
//	                  and arm64, and write packages.lock (versions, sha256)
//	imagebuild build  download the locked .debs (cached), unpack them into
//	                  a rootfs per architecture, add ipvsproxy, and write
//	                  an OCI image layout; prints the index digest.
//	                  --variant nftables: the image for
//	                  --rules-backend=nftables, a subset of the same lock
//	                  (see Variants)
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: imagebuild lock|build [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "lock":
		err = runLock(os.Args[2:])
	case "build":
		err = runBuild(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "imagebuild: unknown command %q (lock or build)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

// Arches are the image's platforms (Debian's names are Go's here).
var Arches = []string{"amd64", "arm64"}

func sourceFiles(flagValue string) []string {
	if flagValue == "" {
		return defaultSourceFiles()
	}
	return strings.Split(flagValue, ",")
}

func runLock(args []string) error {
	fs := flag.NewFlagSet("lock", flag.ContinueOnError)
	lockPath := fs.String("lock", "packages.lock", "lock file to write")
	sources := fs.String("sources", "", "apt source files, comma-separated (default: this machine's /etc/apt)")
	codename := fs.String("codename", "bookworm", "Debian release")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srcs, err := readSources(sourceFiles(*sources), *codename)
	if err != nil {
		return err
	}
	var pins []Pin
	for _, arch := range Arches {
		index := map[string]indexEntry{}
		for _, src := range srcs {
			ps, err := fetchIndex(src, arch, httpGet)
			if err != nil {
				return err
			}
			mergeIndex(index, src.Suite, ps)
		}
		names, err := resolve(index, Roots)
		if err != nil {
			return fmt.Errorf("%s: %w", arch, err)
		}
		got, err := pinsFor(arch, index, names)
		if err != nil {
			return err
		}
		pins = append(pins, got...)
	}
	var b bytes.Buffer
	if err := writeLock(&b, pins); err != nil {
		return err
	}
	return os.WriteFile(*lockPath, b.Bytes(), 0o644)
}

type binaryFlags map[string]string

func (b binaryFlags) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaryFlags) Set(v string) error {
	arch, path, ok := strings.Cut(v, "=")
	if !ok || arch == "" || path == "" {
		return fmt.Errorf("want ARCH=PATH, got %q", v)
	}
	b[arch] = path
	return nil
}

func runBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	lockPath := fs.String("lock", "packages.lock", "lock file")
	sources := fs.String("sources", "", "apt source files for downloads, comma-separated (default: this machine's /etc/apt)")
	cache := fs.String("cache", defaultCache(), "download cache (outside the checkout)")
	out := fs.String("out", "", "OCI image layout directory to write (replaced)")
	ref := fs.String("ref", "", "image reference, registry/repository:tag")
	version := fs.String("version", "dev", "ipvsproxy version, for the labels")
	revision := fs.String("revision", "unknown", "git commit, for the labels")
	nodePrep := fs.String("node-prep", "../node-prep.sh", "deploy/node-prep.sh")
	wrapper := fs.String("iptables-wrapper", "../iptables-wrapper.sh", "deploy/iptables-wrapper.sh")
	variant := fs.String("variant", "default", "image variant: default, or nftables (no iptables, ipset, ipvsadm, conntrack)")
	binaries := binaryFlags{}
	fs.Var(binaries, "binary", "ARCH=PATH of the static ipvsproxy binary; once per architecture")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" {
		return fmt.Errorf("build needs --out and --ref")
	}
	v, err := variantNamed(*variant)
	if err != nil {
		return err
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	f, err := os.Open(*lockPath)
	if err != nil {
		return err
	}
	pins, err := readLock(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *lockPath, err)
	}
	common := AppFiles{}
	if common.NodePrep, err = os.ReadFile(*nodePrep); err != nil {
		return err
	}
	if common.IptablesWrapper, err = os.ReadFile(*wrapper); err != nil {
		return err
	}
	dl := &downloader{cache: *cache, sourceFiles: sourceFiles(*sources), get: httpGet}
	m := Meta{Ref: *ref, Version: *version, Revision: *revision, Epoch: epoch, Description: v.Description, IPTables: v.IPTables}
	idx, err := build(pins, binaries, common, dl, m, v)
	if err != nil {
		return err
	}
	if err := writeLayout(*out, idx, *ref); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", *ref, d)
	return nil
}

// sourceDateEpoch is every timestamp in the image: the Makefile passes
// the commit's time, so a rebuild of the same commit is identical.
func sourceDateEpoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH is not set (the Makefile sets it to the commit's time)")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", v)
	}
	return time.Unix(n, 0).UTC(), nil
}

func defaultCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return filepath.Join(dir, "ipvsproxy-image")
}

func httpGet(url string) ([]byte, error) {
	c := &http.Client{Timeout: 5 * time.Minute}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return io.ReadAll(resp.Body)
}

// sortedKeys is the architectures given, in a fixed order.
func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
