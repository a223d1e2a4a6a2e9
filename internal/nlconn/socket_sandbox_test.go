//go:build sandbox

package nlconn

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// As root (CAP_NET_ADMIN), the dump socket gets its 8 MiB receive buffer
// even though net.core.rmem_max is the kernel's small default: the
// kernel reports twice what was set, for its bookkeeping.
func TestSandboxRcvBufForced(t *testing.T) {
	sandboxtest.RequireRoot(t)
	raw, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Fatal(err)
	}
	rmemMax, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	if rmemMax >= DefaultRcvBuf {
		t.Fatalf("rmem_max is %d: this test needs it below %d to prove anything", rmemMax, DefaultRcvBuf)
	}
	c, err := Dial(Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: DefaultRcvBuf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.RcvBuf()
	if err != nil || got != 2*DefaultRcvBuf {
		t.Errorf("SO_RCVBUF = %d, %v; want %d with rmem_max %d", got, err, 2*DefaultRcvBuf, rmemMax)
	}
}
