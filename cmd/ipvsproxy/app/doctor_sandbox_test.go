//go:build sandbox

package app

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/cmd/ipvsproxy/doctor"
	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// TestSandboxDoctor runs the checks on the real kernel: after the node
// set-up ipvsproxy does (sysctls, kube-ipvs0 with an address) the modules,
// sysctls and link read as set up, and conn_reuse_mode=0 (as kube-router
// leaves it) is reported on a 5.9+ kernel.
func TestSandboxDoctor(t *testing.T) {
	if err := startupSysctls(sysctl.New(), false); err != nil {
		t.Fatal(err)
	}
	d, err := dummyif.New(dummyif.DefaultLinkName)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.EnsureLink(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.DeleteLink() }()
	if err := d.AddAddress(netip.MustParseAddr("10.96.77.1")); err != nil {
		t.Fatal(err)
	}
	o := NewOptions()
	o.IPTablesBackend = "legacy"
	n, err := doctorNode(o)
	if err != nil {
		t.Fatal(err)
	}
	checks := doctor.Run(n)
	for _, name := range []string{"kernel modules", "sysctls", "iptables backend", "kube-ipvs0"} {
		if c := findCheck(checks, name); c.Status != doctor.OK {
			t.Errorf("%s: %+v", name, c)
		}
	}
	if c := findCheck(checks, "kube-ipvs0"); !strings.HasPrefix(c.Detail, "1 addresses") {
		t.Errorf("kube-ipvs0: %+v", c)
	}
	sc := sysctl.New()
	was, err := sc.Get("net/ipv4/vs/conn_reuse_mode")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sc.Set("net/ipv4/vs/conn_reuse_mode", was) }()
	if err := sc.Set("net/ipv4/vs/conn_reuse_mode", "0"); err != nil {
		t.Fatal(err)
	}
	if kernelBefore(5, 9) {
		return
	}
	if c := findCheck(doctor.Run(n), "net/ipv4/vs/conn_reuse_mode"); c.Status != doctor.Warn {
		t.Errorf("conn_reuse_mode=0 on a 5.9+ kernel: %+v", c)
	}
}

func findCheck(checks []doctor.Check, name string) doctor.Check {
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	return doctor.Check{}
}
