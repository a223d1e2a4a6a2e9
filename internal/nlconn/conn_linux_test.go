package nlconn_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// The receive loop is tested against scripted kernels (nlconntest): each
// request gets the datagrams its script builds for the request's
// sequence number, as a kernel would answer, so every path (multi-part
// dumps, interruption, errors, lost messages, timeouts, signals) is
// exercised without one.

const typData = 0x42 // a family's reply type (any value above NLMSG_MIN_TYPE)

var (
	join = nlconntest.Join
	done = nlconntest.Done
	ack  = nlconntest.Ack
)

func item(seq uint32, v string, flags uint16) []byte {
	return nlconntest.Part(typData, seq, []byte(v), flags)
}

func newTestConn(t *testing.T, answer func(n int, seq uint32) []any) (*nlconn.Conn, *nlconntest.Kernel) {
	return nlconntest.New(t, func(n int, seq uint32, _ []byte) []any { return answer(n, seq) })
}

func dumpReq() *nl.NetlinkRequest { return nl.NewNetlinkRequest(typData, unix.NLM_F_DUMP) }

// collector gathers a dump's payloads the way a caller fills its index,
// clearing on reset.
type collector struct {
	got    []string
	resets int
}

func (c *collector) reset() { c.resets++; c.got = c.got[:0] }

func (c *collector) handle(typ uint16, data []byte) error {
	if typ != typData {
		return fmt.Errorf("handler got message type %d", typ)
	}
	c.got = append(c.got, string(data))
	return nil
}

// A dump spread over several datagrams arrives whole and in order; a
// stale reply to an earlier request (another seq) is skipped.
func TestDumpMultiPart(t *testing.T) {
	c, k := newTestConn(t, func(_ int, seq uint32) []any {
		return []any{
			join(item(seq-1, "stale", 0), item(seq, "a", 0), item(seq, "b", 0)),
			join(item(seq, "c", 0)),
			join(item(seq, "d", 0), done(seq, 0, 0)),
		}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(col.got, want) || col.resets != 0 {
		t.Errorf("got %v after %d resets; want %v, none", col.got, col.resets, want)
	}
	if k.Dials != 1 || k.Closes != 0 {
		t.Errorf("%d dials, %d closes; want the one socket kept", k.Dials, k.Closes)
	}
}

// A dump the kernel flags NLM_F_DUMP_INTR is reset and read again; the
// caller ends with the second, consistent dump only.
func TestDumpInterruptedRestarts(t *testing.T) {
	c, k := newTestConn(t, func(n int, seq uint32) []any {
		if n == 0 {
			return []any{join(item(seq, "gone", 0), item(seq, "a", unix.NLM_F_DUMP_INTR), done(seq, 0, unix.NLM_F_DUMP_INTR))}
		}
		return []any{join(item(seq, "a", 0), item(seq, "b", 0), done(seq, 0, 0))}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !slices.Equal(col.got, want) || col.resets != 1 || len(k.Reqs) != 2 {
		t.Errorf("got %v after %d resets and %d requests; want %v after 1 and 2", col.got, col.resets, len(k.Reqs), want)
	}
}

// A table that changes under every attempt fails the dump after
// DumpAttempts; with no reset the first interruption fails it.
func TestDumpInterruptedGivesUp(t *testing.T) {
	always := func(_ int, seq uint32) []any {
		return []any{join(item(seq, "a", unix.NLM_F_DUMP_INTR), done(seq, 0, unix.NLM_F_DUMP_INTR))}
	}
	c, k := newTestConn(t, always)
	var col collector
	err := c.Dump(dumpReq(), col.reset, col.handle)
	if !errors.Is(err, nlconn.ErrDumpInterrupted) || col.resets != nlconn.DumpAttempts-1 || len(k.Reqs) != nlconn.DumpAttempts {
		t.Errorf("err %v after %d resets, %d requests; want ErrDumpInterrupted after %d and %d", err, col.resets, len(k.Reqs), nlconn.DumpAttempts-1, nlconn.DumpAttempts)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("(%d attempts)", nlconn.DumpAttempts)) {
		t.Errorf("error does not say how often it tried: %v", err)
	}
	c, k = newTestConn(t, always)
	if err := c.Dump(dumpReq(), nil, col.handle); err != nlconn.ErrDumpInterrupted || len(k.Reqs) != 1 {
		t.Errorf("without reset: %v after %d requests; want ErrDumpInterrupted after 1", err, len(k.Reqs))
	}
}

// A dump read amid the reader's own writes takes an interrupted dump as
// it came (one request, no reset, every message handed over), and still
// restarts one that lost messages.
func TestDumpAmidWritesTakesAnInterruptedDump(t *testing.T) {
	c, k := newTestConn(t, func(n int, seq uint32) []any {
		if n == 0 {
			return []any{join(item(seq, "a", 0)), join(item(seq, "b", unix.NLM_F_DUMP_INTR), done(seq, 0, unix.NLM_F_DUMP_INTR))}
		}
		return nil
	})
	var col collector
	if err := c.DumpAmidWrites(dumpReq(), col.reset, col.handle); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !slices.Equal(col.got, want) || col.resets != 0 || len(k.Reqs) != 1 {
		t.Errorf("got %v after %d resets and %d requests; want %v after none and 1", col.got, col.resets, len(k.Reqs), want)
	}
	c, k = newTestConn(t, func(n int, seq uint32) []any {
		if n == 0 {
			return []any{join(item(seq, "a", 0)), unix.ENOBUFS}
		}
		return []any{join(item(seq, "a", unix.NLM_F_DUMP_INTR), item(seq, "b", 0), done(seq, 0, 0))}
	})
	col = collector{}
	if err := c.DumpAmidWrites(dumpReq(), col.reset, col.handle); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !slices.Equal(col.got, want) || col.resets != 1 || len(k.Reqs) != 2 {
		t.Errorf("after lost messages: got %v after %d resets and %d requests; want %v after 1 and 2", col.got, col.resets, len(k.Reqs), want)
	}
}

// Lost messages (ENOBUFS) mean the socket's state is unknown: it is
// closed, a new one opened, and the dump restarted after a reset.
func TestDumpENOBUFSRestartsOnNewSocket(t *testing.T) {
	c, k := newTestConn(t, func(n int, seq uint32) []any {
		if n == 0 {
			return []any{join(item(seq, "a", 0)), unix.ENOBUFS}
		}
		return []any{join(item(seq, "a", 0), item(seq, "b", 0), done(seq, 0, 0))}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !slices.Equal(col.got, want) || col.resets != 1 || k.Dials != 2 || k.Closes != 1 {
		t.Errorf("got %v, %d resets, %d dials, %d closes; want %v, 1, 2, 1", col.got, col.resets, k.Dials, k.Closes, want)
	}
	// Without a reset, lost messages fail the dump as interrupted, and
	// still say why.
	c, _ = newTestConn(t, func(_ int, seq uint32) []any { return []any{unix.ENOBUFS} })
	if err := c.Dump(dumpReq(), nil, col.handle); !errors.Is(err, nlconn.ErrDumpInterrupted) || !errors.Is(err, unix.ENOBUFS) {
		t.Errorf("ENOBUFS without reset: %v", err)
	}
}

// A signal during a system call (EINTR) is invisible to the caller.
func TestEINTRRetried(t *testing.T) {
	c, k := newTestConn(t, func(_ int, seq uint32) []any {
		return []any{unix.EINTR, join(item(seq, "a", 0)), unix.EINTR, unix.EINTR, done(seq, 0, 0)}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != nil || !slices.Equal(col.got, []string{"a"}) || k.Dials != 1 {
		t.Errorf("err %v, got %v, %d dials; want a on the first socket", err, col.got, k.Dials)
	}
}

// Errors: an error acknowledgement, a dump whose DONE carries an errno,
// and a zero acknowledgement (success).
func TestErrors(t *testing.T) {
	c, _ := newTestConn(t, func(n int, seq uint32) []any {
		switch n {
		case 0:
			return []any{ack(seq, unix.ENOENT)}
		case 1:
			return []any{join(item(seq, "a", 0), done(seq, unix.ENODEV, 0))}
		}
		return []any{ack(seq, 0)}
	})
	var col collector
	if err := c.Execute(nl.NewNetlinkRequest(typData, unix.NLM_F_ACK), nil); err != unix.ENOENT {
		t.Errorf("error ack: %v, want ENOENT", err)
	}
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != unix.ENODEV {
		t.Errorf("dump ending in an errno: %v, want ENODEV", err)
	}
	if err := c.Execute(nl.NewNetlinkRequest(typData, unix.NLM_F_ACK), nil); err != nil {
		t.Errorf("ack: %v", err)
	}
}

// No reply within the timeout fails the request instead of hanging, and
// the next request works on a new socket (the late reply cannot be
// mistaken for its answer).
func TestTimeoutThenRecover(t *testing.T) {
	c, k := newTestConn(t, func(n int, seq uint32) []any {
		if n == 0 {
			return []any{join(item(seq, "a", 0))} // then nothing: EAGAIN
		}
		return []any{join(item(seq, "b", 0), done(seq, 0, 0))}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); !errors.Is(err, nlconn.ErrTimeout) {
		t.Fatalf("dump with a lost reply: %v, want ErrTimeout", err)
	}
	col = collector{}
	if err := c.Dump(dumpReq(), col.reset, col.handle); err != nil || !slices.Equal(col.got, []string{"b"}) {
		t.Errorf("after a timeout: %v, %v", err, col.got)
	}
	if k.Dials != 2 || k.Closes != 1 {
		t.Errorf("%d dials, %d closes; want the timed-out socket replaced", k.Dials, k.Closes)
	}
}

// The handler's error stops the dump and comes back as it is; the
// socket, with the rest of the dump unread, is replaced.
func TestHandlerErrorStops(t *testing.T) {
	c, k := newTestConn(t, func(_ int, seq uint32) []any {
		return []any{join(item(seq, "a", 0), item(seq, "b", 0)), join(item(seq, "c", 0), done(seq, 0, 0))}
	})
	stop := errors.New("stop")
	n := 0
	err := c.Dump(dumpReq(), nil, func(uint16, []byte) error { n++; return stop })
	if err != stop || n != 1 || k.Closes != 1 {
		t.Errorf("err %v after %d messages, %d closes; want stop after 1, socket closed", err, n, k.Closes)
	}
}

// A malformed datagram fails the request rather than being misread.
func TestMalformed(t *testing.T) {
	c, _ := newTestConn(t, func(_ int, seq uint32) []any {
		b := item(seq, "abc", 0)
		binary.NativeEndian.PutUint32(b, 200) // longer than the datagram
		return []any{b}
	})
	var col collector
	if err := c.Dump(dumpReq(), col.reset, col.handle); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("malformed reply: %v", err)
	}
}

// A dump started while the socket is busy (here: from inside another
// dump's handler) gets a socket of its own instead of deadlocking.
func TestNestedDumpUsesSecondSocket(t *testing.T) {
	c, k := newTestConn(t, func(n int, seq uint32) []any {
		return []any{join(item(seq, fmt.Sprint("x", n), 0), done(seq, 0, 0))}
	})
	var outer, inner collector
	err := c.Dump(dumpReq(), outer.reset, func(typ uint16, data []byte) error {
		if err := outer.handle(typ, data); err != nil {
			return err
		}
		return c.Dump(dumpReq(), inner.reset, inner.handle)
	})
	if err != nil || !slices.Equal(outer.got, []string{"x0"}) || !slices.Equal(inner.got, []string{"x1"}) {
		t.Errorf("err %v, outer %v, inner %v", err, outer.got, inner.got)
	}
	if k.Dials != 2 || k.Closes != 1 {
		t.Errorf("%d dials, %d closes; want a second socket, closed after the inner dump", k.Dials, k.Closes)
	}
}

// An error acknowledgement's echo (what follows the errno) reaches the
// report, and the errno is still the request's error; an acknowledgement
// of success reports nothing.
func TestExecuteReportHandsOverTheEcho(t *testing.T) {
	echo := []byte("header and request as the kernel echoed them")
	c, _ := newTestConn(t, func(n int, seq uint32) []any {
		if n == 1 {
			return []any{ack(seq, 0)}
		}
		errno := -int32(unix.EEXIST)
		payload := binary.NativeEndian.AppendUint32(nil, uint32(errno))
		return []any{nlconntest.Msg(unix.NLMSG_ERROR, 0, seq, append(payload, echo...))}
	})
	var got []string
	report := func(errno unix.Errno, b []byte) { got = append(got, fmt.Sprintf("%d %s", errno, b)) }
	if err := c.ExecuteReport(nl.NewNetlinkRequest(typData, unix.NLM_F_ACK), nil, report); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("error: %v", err)
	}
	if err := c.ExecuteReport(nl.NewNetlinkRequest(typData, unix.NLM_F_ACK), nil, report); err != nil {
		t.Fatalf("acknowledged request: %v", err)
	}
	want := fmt.Sprintf("%d %s", unix.EEXIST, echo)
	if len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("reports %q, want one %q", got, want)
	}
}
