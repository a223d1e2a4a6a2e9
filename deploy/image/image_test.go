//go:build image

// The built image, unpacked and run: `make image-test` (part of `make
// test`) builds bin/image and bin/image-nftables and runs this with
// IPVSPROXY_IMAGE pointing at each, IPVSPROXY_IMAGE_VARIANT naming it.
// It needs root (chroot, a network namespace), as the sandbox tests do.
package main

import (
	"archive/tar"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// images opens the layout and returns its reference and one image per
// architecture, after go-containerregistry's validation of the whole
// index (every blob's digest and size, every layer's diff ID).
// It runs once; the tests share what it found.
func images(t *testing.T) (string, map[string]v1.Image) {
	t.Helper()
	loadOnce.Do(func() { loaded.ref, loaded.imgs, loaded.err = loadImages() })
	if loaded.err != nil {
		t.Fatal(loaded.err)
	}
	return loaded.ref, loaded.imgs
}

var (
	loadOnce sync.Once
	loaded   struct {
		ref  string
		imgs map[string]v1.Image
		err  error
	}
)

func loadImages() (string, map[string]v1.Image, error) {
	dir := os.Getenv("IPVSPROXY_IMAGE")
	if dir == "" {
		return "", nil, fmt.Errorf("IPVSPROXY_IMAGE is not set: run `make image-test`")
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", nil, err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return "", nil, err
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 {
		return "", nil, fmt.Errorf("%s/index.json: want one image index (%v)", dir, err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		return "", nil, err
	}
	if err := validate.Index(idx); err != nil {
		return "", nil, fmt.Errorf("the image index is not valid: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return "", nil, err
	}
	out := map[string]v1.Image{}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return "", nil, err
		}
		out[d.Platform.OS+"/"+d.Platform.Architecture] = img
	}
	return tm.Manifests[0].Annotations["io.containerd.image.name"], out, nil
}

// unpack writes the image's flattened filesystem under a new directory.
func unpack(t *testing.T, img v1.Image) string {
	t.Helper()
	root := t.TempDir()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return root
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(h.Name)
		if strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			t.Fatalf("layer entry outside the root: %s", h.Name)
		}
		p := filepath.Join(root, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode&0o777))
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777)); err == nil {
				_, err = io.Copy(f, tr)
				f.Close()
			}
		default:
			err = fmt.Errorf("unexpected entry type %q", h.Typeflag)
		}
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}

// imageVariant is the variant under test (IPVSPROXY_IMAGE_VARIANT).
func imageVariant(t *testing.T) Variant {
	t.Helper()
	name := os.Getenv("IPVSPROXY_IMAGE_VARIANT")
	if name == "" {
		name = "default"
	}
	v, err := variantNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The default image is the one deploy/daemonset.yaml runs; a variant is
// tagged <that tag>-<variant>, which its component (deploy/<variant>)
// sets.
func TestImageNamesTheReferenceDeployUses(t *testing.T) {
	ref, imgs := images(t)
	v := imageVariant(t)
	manifest, err := os.ReadFile("../daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+image:\s*(\S+)`).FindAllSubmatch(manifest, -1)
	if len(m) == 0 {
		t.Fatal("deploy/daemonset.yaml names no image")
	}
	suffix := ""
	if v.Name != "default" {
		suffix = "-" + v.Name
		component, err := os.ReadFile("../" + v.Name + "/kustomization.yaml")
		if err != nil {
			t.Fatal(err)
		}
		tag := regexp.MustCompile(`(?m)^\s+newTag:\s*(\S+)`).FindSubmatch(component)
		if tag == nil || !strings.HasSuffix(ref, ":"+string(tag[1])) {
			t.Errorf("the layout is tagged %q; deploy/%s sets the tag %q", ref, v.Name, tag)
		}
	}
	for _, want := range m {
		if string(want[1])+suffix != ref {
			t.Errorf("the layout is tagged %q; deploy/daemonset.yaml runs %q (with %q for this variant)", ref, want[1], suffix)
		}
	}
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		if imgs[p] == nil {
			t.Errorf("no %s image in the index", p)
		}
	}
}

// elfMachine is the ELF machine each platform's binaries must have: a
// package of the wrong architecture in the lock would otherwise only
// show on a node.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// libDirs are where glibc's loader looks without an ld.so.cache (the
// image has none: no ldconfig ran), Debian's multiarch ones first.
func libDirs(arch string) []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[arch]
	return []string{"usr/lib/" + triplet, "usr/lib"}
}

// optionalLibs are plugin dependencies Debian itself does not install
// with the package: tc's ATM qdisc plugin needs libatm1, which iproute2
// only suggests; `tc qdisc add ... atm` is the one command that loads it.
var optionalLibs = map[string]bool{"q_atm.so libatm.so.1": true}

// missingLibs lists, for every ELF file in the rootfs, the interpreter
// and shared libraries it needs that the rootfs lacks, and any file built
// for another machine.
func missingLibs(root, arch string) ([]string, error) {
	var problems []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := elf.Open(p)
		if err != nil {
			return nil // not ELF
		}
		defer f.Close()
		rel, _ := filepath.Rel(root, p)
		if f.Machine != elfMachine[arch] {
			problems = append(problems, fmt.Sprintf("%s: built for %s", rel, f.Machine))
			return nil
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b, _ := io.ReadAll(prog.Open())
				interp := strings.TrimRight(string(b), "\x00")
				if _, err := os.Stat(inRoot(root, interp)); err != nil {
					problems = append(problems, fmt.Sprintf("%s: interpreter %s missing", rel, interp))
				}
			}
		}
		libs, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		// glibc's gconv modules find their helpers through RUNPATH $ORIGIN.
		dirs := libDirs(arch)
		for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
			paths, _ := f.DynString(tag)
			for _, rp := range paths {
				for _, d := range strings.Split(rp, ":") {
					d = strings.ReplaceAll(d, "$ORIGIN", "/"+filepath.Dir(rel))
					dirs = append(dirs, strings.TrimPrefix(d, "/"))
				}
			}
		}
		for _, lib := range libs {
			if optionalLibs[filepath.Base(rel)+" "+lib] {
				continue
			}
			found := false
			for _, dir := range dirs {
				if _, err := os.Stat(inRoot(root, "/"+dir+"/"+lib)); err == nil {
					found = true
					break
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s: needs %s, not in the image", rel, lib))
			}
		}
		return nil
	})
	return problems, err
}

// inRoot resolves p inside root, following absolute symlinks (such as
// /lib64 -> usr/lib64) against root rather than the host.
func inRoot(root, p string) string {
	cur := ""
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i := 0; i < len(parts); i++ {
		next := filepath.Join(cur, parts[i])
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			cur = next
			continue
		}
		if filepath.IsAbs(target) {
			cur = ""
		} else {
			cur = filepath.Dir(next)
		}
		rest := append(strings.Split(strings.Trim(target, "/"), "/"), parts[i+1:]...)
		parts, i = rest, -1
		if len(parts) > 64 {
			return filepath.Join(root, "symlink-loop")
		}
	}
	return filepath.Join(root, filepath.Clean("/"+cur))
}

func TestEveryBinaryFindsItsLibraries(t *testing.T) {
	_, imgs := images(t)
	for p, img := range imgs {
		arch := strings.TrimPrefix(p, "linux/")
		t.Run(arch, func(t *testing.T) {
			root := unpack(t, img)
			problems, err := missingLibs(root, arch)
			if err != nil {
				t.Fatal(err)
			}
			for _, pr := range problems {
				t.Error(pr)
			}
		})
	}
}

// run executes argv inside root as the container would (the image's
// PATH, root's cwd), in a network namespace of its own so nothing reads
// or touches the host's firewall.
func run(root string, argv ...string) (string, error) {
	// The image's /bin/sh finds the command on the image's PATH (exec's own
	// lookup would search the host's).
	cmd := exec.Command("/bin/sh", append([]string{"-c", `exec "$@"`, "sh"}, argv...)...)
	cmd.Dir = "/"
	cmd.Env = append([]string(nil), Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestCommandsRunInTheImage(t *testing.T) {
	if runtime.GOARCH != "amd64" || os.Geteuid() != 0 {
		t.Fatalf("needs root on amd64 (chroot, network namespace); this is %s, uid %d", runtime.GOARCH, os.Geteuid())
	}
	_, imgs := images(t)
	root := unpack(t, imgs["linux/amd64"])
	version := os.Getenv("IPVSPROXY_VERSION")
	type commandCase struct {
		argv    []string
		want    string // a regexp the output must match
		mayFail bool   // the command needs a kernel feature a test host may lack
	}
	// unwanted are regexps a command's output must not match.
	unwanted := map[string]string{}
	cases := []commandCase{
		{[]string{"ipvsproxy", "version"}, `^ipvsproxy ` + regexp.QuoteMeta(version) + ` \(commit [0-9a-f]+, built `, false},
		{[]string{"iptables", "--version"}, `^iptables v1\.8\.\d+ \(nf_tables\)$`, false}, // the wrapper: an empty node is nft
		{[]string{"iptables-legacy", "--version"}, `^iptables v1\.8\.\d+ \(legacy\)$`, false},
		{[]string{"iptables-nft-save"}, `^$|nf_tables`, false},
		{[]string{"ip6tables-save"}, `^$|Generated`, false},                    // through the wrapper's detection (sh, grep, basename)
		{[]string{"/usr/sbin/iptables", "--version"}, `\(nf_tables\)$`, false}, // Debian's alternative
		{[]string{"ipset", "--version"}, `^ipset v7\.`, false},
		{[]string{"ip", "-V"}, `(?m)^ip utility, iproute2-`, false},
		// ipvsadm opens IPVS before anything else; on a host without ip_vs
		// it gets as far as saying so, which proves it loaded.
		{[]string{"ipvsadm", "--version"}, `^ipvsadm v1\.|Can't initialize ipvs`, true},
		{[]string{"conntrack", "--version"}, `^conntrack v1\.`, false},
		{[]string{"modprobe", "--version"}, `^kmod version \d+`, false},
	}
	if !imageVariant(t).IPTables {
		cases = []commandCase{
			{[]string{"ipvsproxy", "version"}, `^ipvsproxy ` + regexp.QuoteMeta(version) + ` \(commit [0-9a-f]+, built `, false},
			{[]string{"modprobe", "--version"}, `^kmod version \d+`, false},
			// A subcommand that needs iptables says so in one line
			// (doctor's iptables check fails; the others run).
			{[]string{"ipvsproxy", "doctor"}, `(?m)^fail +iptables backend +iptables: no iptables tools here .*--rules-backend=nftables`, true},
			// With the nftables backend it asks for nothing of them.
			{[]string{"ipvsproxy", "doctor", "--rules-backend=nftables"}, `(?m)^\w+ +nftables `, true},
		}
		unwanted["ipvsproxy doctor"] = `panic|goroutine`
		unwanted["ipvsproxy doctor --rules-backend=nftables"] = `iptables|panic|goroutine`
	}
	for _, c := range cases {
		out, err := run(root, c.argv...)
		if err != nil && !(c.mayFail && regexp.MustCompile(c.want).MatchString(out)) {
			t.Errorf("%s: %v: %s", strings.Join(c.argv, " "), err, out)
			continue
		}
		if !regexp.MustCompile(c.want).MatchString(out) {
			t.Errorf("%s printed %q, want /%s/", strings.Join(c.argv, " "), out, c.want)
		}
		if u := unwanted[strings.Join(c.argv, " ")]; u != "" && regexp.MustCompile(u).MatchString(out) {
			t.Errorf("%s printed %q, which matches /%s/", strings.Join(c.argv, " "), out, u)
		}
	}
	if version == "" {
		t.Error("IPVSPROXY_VERSION is not set: the version printed was not checked")
	}
}

// TestAMissingLibraryIsCaught removes one library from an unpacked image
// and expects both checks above to notice: they are not vacuous.
func TestAMissingLibraryIsCaught(t *testing.T) {
	_, imgs := images(t)
	root := unpack(t, imgs["linux/amd64"])
	lib, argv := "libipset.so.13", []string{"ipset", "--version"}
	if !imageVariant(t).IPTables {
		lib, argv = "libzstd.so.1", []string{"modprobe", "--version"} // kmod links libkmod statically
	}
	libs, _ := filepath.Glob(filepath.Join(root, "usr/lib/x86_64-linux-gnu/"+lib+"*"))
	if len(libs) == 0 {
		t.Fatalf("%s is not in the image", lib)
	}
	for _, l := range libs {
		os.Remove(l)
	}
	problems, err := missingLibs(root, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(problems, "\n"), "needs "+lib) {
		t.Errorf("the library check did not notice: %q", problems)
	}
	if os.Geteuid() == 0 {
		out, err := run(root, argv...)
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Errorf("%s without its library: err %v, output %q; want it to fail", argv[0], err, out)
		}
	}
}

// TestDaemonSetCommandsStartInTheImage runs each container command that
// deploy/daemonset.yaml names (node-prep: its shell, modprobe, then
// `ipvsproxy prepare-node`) with --help: a path the manifest names and
// the image lacks would otherwise only show on a node.
func TestDaemonSetCommandsStartInTheImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (chroot, network namespace)")
	}
	manifest, err := os.ReadFile("../daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cmds := regexp.MustCompile(`(?m)^\s+command:\s*\[([^\]]+)\]`).FindAllSubmatch(manifest, -1)
	if len(cmds) == 0 {
		t.Fatal("deploy/daemonset.yaml names no command")
	}
	_, imgs := images(t)
	root := unpack(t, imgs["linux/amd64"])
	for _, c := range cmds {
		argv := strings.Fields(strings.ReplaceAll(string(c[1]), ",", " "))
		out, err := run(root, append(argv, "--help")...)
		if err != nil || !strings.Contains(out, "prepare-node") {
			t.Errorf("%s --help: %v: %s", strings.Join(argv, " "), err, out)
		}
	}
}

// absentTools are what the nftables image must not have: the tools the
// iptables backend and its operators use. ipvsproxy with
// --rules-backend=nftables runs none of them.
var absentTools = []string{"iptables", "ip6tables", "iptables-save", "iptables-restore", "iptables-legacy",
	"iptables-nft", "xtables-nft-multi", "xtables-legacy-multi", "iptables-wrapper", "ipset", "ipvsadm",
	"conntrack", "nft", "ip", "tc", "arptables", "ebtables"}

// TestToolsAbsentFromTheNFTablesImage walks the nftables image for any
// of absentTools (any directory, any file type) and for their libraries,
// and checks that ipvsproxy needs no library at all (static), so the
// small image cannot lack one.
func TestToolsAbsentFromTheNFTablesImage(t *testing.T) {
	v := imageVariant(t)
	if v.IPTables {
		t.Skipf("the %s image has the iptables tools: TestCommandsRunInTheImage runs them", v.Name)
	}
	_, imgs := images(t)
	for p, img := range imgs {
		arch := strings.TrimPrefix(p, "linux/")
		t.Run(arch, func(t *testing.T) {
			root := unpack(t, img)
			absent := map[string]bool{}
			for _, n := range absentTools {
				absent[n] = true
			}
			libRE := regexp.MustCompile(`^lib(ip4tc|ip6tc|xtables|ipset|nftnl|nftables|netfilter-conntrack|nl-3|nl-genl-3)\.so`)
			err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(root, path)
				if absent[d.Name()] || libRE.MatchString(d.Name()) {
					t.Errorf("the %s image has %s", v.Name, rel)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(filepath.Join(root, "usr/local/bin/ipvsproxy"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			libs, _ := f.ImportedLibraries()
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Error("ipvsproxy has an ELF interpreter: it is not static")
				}
			}
			if len(libs) > 0 {
				t.Errorf("ipvsproxy needs %q: it is not static", libs)
			}
			for _, want := range []string{"usr/local/bin/ipvsproxy-node-prep", "usr/sbin/modprobe", "usr/bin/sh", "etc/os-release"} {
				if _, err := os.Lstat(filepath.Join(root, want)); err != nil {
					t.Errorf("the %s image lacks %s", v.Name, want)
				}
			}
		})
	}
}
