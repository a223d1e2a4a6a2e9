package ipvs

import (
	"errors"
	"os"
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
