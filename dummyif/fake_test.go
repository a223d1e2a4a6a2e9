package dummyif

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
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

// The Fake's AddAddresses is AddAddress for each address: the same
// addresses bound, the same errors at each index (invalid, a fault),
// counted as one send per nlconn.MaxPipelined valid addresses; a fault on
// a send fails its addresses.
func TestFakeAddAddressesIsOneByOne(t *testing.T) {
	boom := errors.New("boom")
	setup := func() *Fake {
		f := NewFake("")
		mustNil(t, f.EnsureLink())
		f.FailOn(VerbAddAddress, func(c Call) bool { return c.Addr == vip4b }, boom)
		f.ResetCounts()
		return f
	}
	addrs := []netip.Addr{vip4, {}, vip4b, vip6, vip4}
	one, batched := setup(), setup()
	errs := batched.AddAddresses(addrs)
	for i, a := range addrs {
		if want := one.AddAddress(a); fmt.Sprint(errs[i]) != fmt.Sprint(want) {
			t.Errorf("address %d: %v, want %v", i, errs[i], want)
		}
	}
	if one.String() != batched.String() {
		t.Errorf("batched:\n%s\none by one:\n%s", batched.String(), one.String())
	}
	if batched.Count(VerbAddAddresses) != 1 || batched.Count(VerbAddAddress) != 0 {
		t.Errorf("counts %v, want one AddAddresses", batched.Counts())
	}

	f := setup()
	f.FailTimes(1, VerbAddAddresses, nil, boom)
	many := make([]netip.Addr, nlconn.MaxPipelined+3)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})
	}
	errs = f.AddAddresses(many)
	for i, err := range errs {
		if errors.Is(err, boom) != (i < nlconn.MaxPipelined) {
			t.Fatalf("address %d: %v", i, err)
		}
	}
	if got := len(f.Addresses()); got != 3 || f.Count(VerbAddAddresses) != 2 {
		t.Errorf("%d addresses bound in %d sends, want the second send's 3 in 2", got, f.Count(VerbAddAddresses))
	}
}
