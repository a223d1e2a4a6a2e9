//go:build sandbox

package nftrules

import (
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/owned"
)

// sandboxNodeNS is the network namespace a sandbox test programs.
const sandboxNodeNS = "nftrules-test"

// sandboxNetns makes a fresh network namespace and returns the options
// that program it and a function listing its table with the real nft.
func sandboxNetns(t testing.TB) ([]nftables.ConnOption, func() string) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	const ns = sandboxNodeNS
	_ = exec.Command("ip", "netns", "del", ns).Run()
	sandboxtest.Run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	f, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	opts := []nftables.ConnOption{nftables.WithNetNSFd(int(f.Fd()))}
	switch err := Probe(opts...); {
	case errors.Is(err, ErrUnsupported):
		t.Skipf("the 6.1 sandbox? %v", err)
	case err != nil:
		t.Fatal(err)
	}
	list := func() string {
		out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", TableName).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list table: %v: %s", err, out)
		}
		return string(out)
	}
	return opts, list
}

// The same writes on the kernel and on the fake: nft lists exactly what
// the fake prints, for every golden configuration.
func TestSandboxListingMatchesFake(t *testing.T) {
	for name, cfg := range goldenConfigs(t) {
		t.Run(name, func(t *testing.T) {
			opts, list := sandboxNetns(t)
			kern, err := New(cfg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			fake := newTestFake(t, cfg)
			if _, err := kern.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, v6 := range cfg.families() {
				for set, entries := range sampleEntries(v6) {
					for _, w := range []Interface{kern, fake} {
						if err := w.AddElements(set, entries...); err != nil {
							t.Fatalf("%s: %v", set, err)
						}
					}
				}
			}
			if diff := diffListings(t, fake.String(), list()); diff != "" {
				t.Errorf("nft list table (-fake +kernel):\n%s", diff)
			}
			for _, v6 := range cfg.families() {
				for set, want := range sampleEntries(v6) {
					got, err := kern.ListElements(set)
					if err != nil {
						t.Fatal(err)
					}
					checkSameEntries(t, set, want, got)
				}
			}
			// Deleting (one absent entry in the batch) and re-ensuring
			// keep the two equal; deleting the table leaves nothing.
			v6 := !cfg.IPv4
			set := owned.SetName(owned.SetClusterIP, v6)
			absent := ipPort("10.96.9.9", "tcp", 1)
			if v6 {
				absent = ipPort("fd00::99", "tcp", 1)
			}
			gone := append(sampleEntries(v6)[set][:2:2], absent)
			for _, w := range []Interface{kern, fake} {
				if err := w.DeleteElements(set, gone...); err != nil {
					t.Fatal(err)
				}
				if _, err := w.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			if diff := diffListings(t, fake.String(), list()); diff != "" {
				t.Errorf("after deletes (-fake +kernel):\n%s", diff)
			}
			sets, err := kern.IPSets().ListSets()
			if got, want := setNames(sets), owned.SetNames(cfg.IPv4, cfg.IPv6); err != nil || !slices.Equal(got, want) {
				t.Errorf("ListSets: %v, %v; want %v", got, err, want)
			}
			if err := kern.DeleteTable(); err != nil {
				t.Fatal(err)
			}
			if err := kern.DeleteTable(); err != nil {
				t.Errorf("deleting an absent table: %v", err)
			}
			if sets, err := kern.IPSets().ListSets(); err != nil || len(sets) != 0 {
				t.Errorf("ListSets without the table: %v, %v; want none", sets, err)
			}
		})
	}
}

// diffListings compares two `nft list table` texts, the elements of
// hash sets in any order (see sortHashSetElements: the order nft prints
// them in is the kernel's hash order).
func diffListings(t *testing.T, fake, kernel string) string {
	t.Helper()
	f, err := sortHashSetElements(fake)
	if err != nil {
		t.Fatalf("fake listing: %v", err)
	}
	k, err := sortHashSetElements(kernel)
	if err != nil {
		t.Fatalf("nft listing: %v\n%s", err, kernel)
	}
	return cmp.Diff(f, k)
}

// The kernel refuses what the fake refuses, with the same errno.
func TestSandboxRefusalsMatchFake(t *testing.T) {
	opts, _ := sandboxNetns(t)
	cfg := DefaultConfig(true, true)
	kern, err := New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kern.Sync(); err != nil {
		t.Fatal(err)
	}
	fake := newTestFake(t, cfg)
	cidrSet, cidr := mustElem(t, fake, owned.SetLoadBalancerSrcCIDR, ipPortNet("192.0.2.10", 443, "203.0.113.0/24"))
	_, inner := mustElem(t, fake, owned.SetLoadBalancerSrcCIDR, ipPortNet("192.0.2.10", 443, "203.0.113.128/25"))
	cip, vip := mustElem(t, fake, owned.SetClusterIP, ipPort("10.96.0.1", "tcp", 443))
	for _, be := range []backend{kern.be, fake.w.be} {
		if err := be.commit([]op{opAddElems{set: cidrSet, elems: []element{cidr}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		ops  []op
		want unix.Errno
	}{
		{"overlapping interval", []op{opAddElems{set: cidrSet, elems: []element{inner}}}, unix.EEXIST},
		{"delete a missing element", []op{opDelElems{set: cip, elems: []element{vip}}}, unix.ENOENT},
		{"IPv4 key in an IPv6 set", []op{opAddElems{set: fake.w.layout.set("cluster-ip-v6"), elems: []element{vip}}}, unix.EINVAL},
		{"delete a chain a rule jumps to", []op{opDelChain{chainServices}}, unix.EBUSY},
	} {
		for name, be := range map[string]backend{"kernel": kern.be, "fake": fake.w.be} {
			if err := be.commit(tc.ops); !errors.Is(err, tc.want) {
				t.Errorf("%s, %s: got %v, want %v", tc.name, name, err, tc.want)
			}
		}
	}
	if err := kern.DeleteTable(); err != nil {
		t.Fatal(err)
	}
}

func ipPortNet(ip string, port uint16, cidr string) ipset.Entry {
	e := ipPort(ip, "tcp", port)
	e.Net = netip.MustParsePrefix(cidr)
	return e
}
