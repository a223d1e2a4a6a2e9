package ipvs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestNewWithoutIPVS pins the one-line message an operator gets on a kernel
// without IPVS (the development machines have none). Where IPVS exists,
// such as inside the sandbox, New must instead succeed. Either way the
// test asserts something; it never skips.
func TestNewWithoutIPVS(t *testing.T) {
	_, statErr := os.Stat("/proc/net/ip_vs")
	h, err := New()
	if statErr == nil {
		if err != nil {
			t.Fatalf("IPVS is present (/proc/net/ip_vs) but New failed: %v", err)
		}
		h.Close()
		return
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("New() on a kernel without IPVS = %v, want ErrUnavailable", err)
	}
	const want = "IPVS is not available in this kernel: load the ip_vs module (modprobe ip_vs)"
	if err.Error() != want {
		t.Errorf("New() error %q, want %q", err, want)
	}
}

func TestSchedulerAvailable(t *testing.T) {
	for _, name := range []string{"", "../rr", "r r", "RR"} {
		if err := SchedulerAvailable(name); err == nil || err.Error() != `invalid IPVS scheduler name "`+name+`"` {
			t.Errorf("SchedulerAvailable(%q) = %v, want invalid name", name, err)
		}
	}
	const want = `IPVS scheduler "nosuch" is not available in this kernel: load the ip_vs_nosuch module (modprobe ip_vs_nosuch)`
	if err := SchedulerAvailable("nosuch"); err == nil || err.Error() != want {
		t.Errorf("SchedulerAvailable(nosuch) = %v, want %q", err, want)
	}
}

func TestListsModule(t *testing.T) {
	dep := filepath.Join(t.TempDir(), "modules.dep")
	content := "kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz: kernel/net/netfilter/ipvs/ip_vs.ko.xz\n" +
		"kernel/net/netfilter/ipvs/ip_vs_sh.ko:\n" +
		"kernel/net/netfilter/ipvs/ip_vs_wrr.ko.zst: kernel/net/netfilter/ipvs/ip_vs_mh.ko.zst\n"
	if err := os.WriteFile(dep, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for mod, want := range map[string]bool{"ip_vs_rr": true, "ip_vs_sh": true, "ip_vs_wrr": true, "ip_vs_lc": false,
		// Named only as a dependency: not proof the file is installed.
		"ip_vs_mh": false, "ip_vs": false} {
		if got := listsModule(dep, mod); got != want {
			t.Errorf("listsModule(%s) = %v, want %v", mod, got, want)
		}
	}
	if listsModule(filepath.Join(t.TempDir(), "missing"), "ip_vs_rr") {
		t.Error("a missing file lists modules")
	}
}
