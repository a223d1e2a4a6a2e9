package nlconn_test

import (
	"errors"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// These use a real rtnetlink socket, which needs no privilege.

// A link dump through a real socket returns the loopback link.
func TestRealSocketDump(t *testing.T) {
	c, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: nlconn.DefaultRcvBuf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	names := map[string]bool{}
	err = c.Dump(req, func() { clear(names) }, func(typ uint16, data []byte) error {
		if typ != unix.RTM_NEWLINK || len(data) < unix.SizeofIfInfomsg {
			return errors.New("not a link")
		}
		for it := nlconn.Attrs(data[unix.SizeofIfInfomsg:]); it.Next(); {
			if it.Type == unix.IFLA_IFNAME {
				names[string(it.Value[:len(it.Value)-1])] = true
			}
		}
		return nil
	})
	if err != nil || !names["lo"] {
		t.Errorf("link dump: %v, %v; want lo among them", err, names)
	}
}

// A request the kernel does not answer (a NOOP without NLM_F_ACK) times
// out instead of hanging, and the nlconn.Conn still works afterwards.
func TestRealSocketTimeout(t *testing.T) {
	c, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	err = c.Execute(nl.NewNetlinkRequest(unix.NLMSG_NOOP, 0), func(uint16, []byte) error { return nil })
	if !errors.Is(err, nlconn.ErrTimeout) {
		t.Fatalf("unanswered request: %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the timeout took %v", d)
	}
	if err := c.Execute(nl.NewNetlinkRequest(unix.NLMSG_NOOP, unix.NLM_F_ACK), nil); err != nil {
		t.Errorf("acknowledged NOOP after a timeout: %v", err)
	}
}
