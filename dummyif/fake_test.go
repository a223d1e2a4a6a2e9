package dummyif

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
)

var (
	vip4  = netip.MustParseAddr("10.96.0.10")
	vip4b = netip.MustParseAddr("10.96.0.11")
	vip6  = netip.MustParseAddr("fd00::10")
)

func TestFakeStartsWithoutLink(t *testing.T) {
	f := NewFake("")
	if _, err := f.ListAddresses(); !errors.Is(err, ErrNoLink) {
		t.Fatalf("ListAddresses before EnsureLink: err = %v, want ErrNoLink", err)
	}
	if err := f.AddAddress(vip4); !errors.Is(err, ErrNoLink) {
		t.Fatalf("AddAddress before EnsureLink: err = %v, want ErrNoLink", err)
	}
	if err := f.DeleteAddress(vip4); err != nil {
		t.Fatalf("DeleteAddress on missing link: %v (absent address is success)", err)
	}
	if got, want := f.String(), "Device \"kube-ipvs0\" does not exist.\n"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
}

func TestFakeAddListDelete(t *testing.T) {
	f := NewFake(DefaultLinkName)
	mustNil(t, f.EnsureLink())
	mustNil(t, f.EnsureLink())
	for _, a := range []netip.Addr{vip6, vip4b, vip4, vip4} {
		mustNil(t, f.AddAddress(a))
	}
	// An IPv4-mapped form is the same kernel address.
	mustNil(t, f.AddAddress(netip.AddrFrom16(vip4.As16())))

	got, err := f.ListAddresses()
	mustNil(t, err)
	if want := []netip.Addr{vip4, vip4b, vip6}; !slices.Equal(got, want) {
		t.Fatalf("ListAddresses = %v, want %v", got, want)
	}
	want := `2: kube-ipvs0    inet 10.96.0.10/32 scope global kube-ipvs0\       valid_lft forever preferred_lft forever
2: kube-ipvs0    inet 10.96.0.11/32 scope global kube-ipvs0\       valid_lft forever preferred_lft forever
2: kube-ipvs0    inet6 fd00::10/128 scope global nodad \       valid_lft forever preferred_lft forever
`
	if got := f.String(); got != want {
		t.Fatalf("String() =\n%s\nwant\n%s", got, want)
	}

	mustNil(t, f.DeleteAddress(vip4b))
	mustNil(t, f.DeleteAddress(vip4b))
	if got, want := f.Addresses(), []netip.Addr{vip4, vip6}; !slices.Equal(got, want) {
		t.Fatalf("Addresses after delete = %v, want %v", got, want)
	}
	mustNil(t, f.DeleteLink())
	mustNil(t, f.EnsureLink())
	if got := f.Addresses(); len(got) != 0 {
		t.Fatalf("addresses survived DeleteLink: %v", got)
	}
}

func TestFakeCounts(t *testing.T) {
	f := NewFake("")
	mustNil(t, f.EnsureLink())
	mustNil(t, f.AddAddress(vip4))
	mustNil(t, f.AddAddress(vip4))
	_, _ = f.ListAddresses()
	_, _ = f.LocalAddresses()
	_ = f.String()
	_ = f.Addresses()
	want := map[string]int{VerbEnsureLink: 1, VerbAddAddress: 2, VerbListAddresses: 1, VerbLocalAddresses: 1}
	if got := f.Counts(); !maps.Equal(got, want) {
		t.Fatalf("Counts() = %v, want %v", got, want)
	}
	if got := f.Count(VerbAddAddress); got != 2 {
		t.Fatalf("Count(AddAddress) = %d, want 2", got)
	}
	f.ResetCounts()
	if got := f.Counts(); len(got) != 0 {
		t.Fatalf("Counts() after reset = %v", got)
	}
}

func TestFakeFailOnChangesNothing(t *testing.T) {
	f := NewFake("")
	mustNil(t, f.EnsureLink())
	mustNil(t, f.AddAddress(vip4))
	boom := errors.New("boom")
	undo := f.FailOn("", func(c Call) bool {
		return c.Addr == vip4 || c.Addr == vip6 || c.Verb == VerbDeleteLink || c.Verb == VerbListAddresses
	}, boom)
	before := f.String()
	if err := f.AddAddress(vip6); !errors.Is(err, boom) {
		t.Fatalf("AddAddress err = %v, want boom", err)
	}
	if err := f.DeleteAddress(vip4); !errors.Is(err, boom) {
		t.Fatalf("DeleteAddress err = %v, want boom", err)
	}
	if err := f.DeleteLink(); !errors.Is(err, boom) {
		t.Fatalf("DeleteLink err = %v, want boom", err)
	}
	if _, err := f.ListAddresses(); !errors.Is(err, boom) {
		t.Fatalf("ListAddresses err = %v, want boom", err)
	}
	if after := f.String(); after != before {
		t.Fatalf("failed calls changed state:\n%s\nwas\n%s", after, before)
	}
	mustNil(t, f.AddAddress(vip4b)) // hook lets other addresses through
	if got := f.Count(VerbAddAddress); got != 3 {
		t.Fatalf("Count(AddAddress) = %d, want 3 (failed calls count)", got)
	}
	undo()
	mustNil(t, f.AddAddress(vip6))
}

func TestFakeLocalAddresses(t *testing.T) {
	f := NewFake("")
	lo := netip.MustParseAddr("127.0.0.1")
	node := netip.MustParseAddr("192.168.1.5")
	f.SetLocalAddresses(node, lo, node)
	got, err := f.LocalAddresses()
	mustNil(t, err)
	if want := []netip.Addr{lo, node}; !slices.Equal(got, want) {
		t.Fatalf("LocalAddresses = %v, want %v", got, want)
	}
}

func TestFakeConcurrent(t *testing.T) {
	f := NewFake("")
	mustNil(t, f.EnsureLink())
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				a := netip.MustParseAddr(fmt.Sprintf("10.96.%d.%d", i, j))
				_ = f.AddAddress(a)
				_, _ = f.ListAddresses()
				_ = f.String()
				_ = f.DeleteAddress(a)
			}
		})
	}
	wg.Wait()
	if got := f.Count(VerbAddAddress); got != 400 {
		t.Fatalf("Count(AddAddress) = %d, want 400", got)
	}
	if got := f.Addresses(); len(got) != 0 {
		t.Fatalf("left over: %v", got)
	}
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
