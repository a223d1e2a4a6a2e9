package nlconn

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const (
	// DefaultRcvBuf is the receive buffer a dump socket asks for. The
	// kernel builds a dump one message batch (up to 32 KiB) at a time,
	// each time the reader has drained the queue below half of this
	// buffer, and fails with ENOBUFS when it finds the buffer full; 8 MiB
	// leaves room for hundreds of batches and whatever else is queued.
	DefaultRcvBuf = 8 << 20
	// DefaultTimeout bounds each wait for a reply message. It is long,
	// because a dump of a big table in a slow (emulated) kernel takes
	// seconds, but finite: a lost reply must not hang the sync loop.
	DefaultTimeout = 60 * time.Second
	// DumpAttempts bounds how often one dump is started: a table that
	// changes under every attempt fails the dump rather than loop.
	DumpAttempts = 5
	// readBuf holds the largest datagram a dump sends: the kernel caps
	// dump batches at 32 KiB (and sizes them from our read buffer).
	readBuf = 64 << 10
)

// ErrTimeout is wrapped by the error of a request that got no complete
// reply within the Config's Timeout.
var ErrTimeout = errors.New("no reply from the kernel in time")

// Config says how to open a Conn's sockets.
type Config struct {
	Protocol int // unix.NETLINK_ROUTE, unix.NETLINK_GENERIC, ...
	// RcvBuf is the receive buffer to ask for, in bytes; 0 leaves the
	// kernel's default (right for sockets that only send requests and
	// read acknowledgements). It is forced past net.core.rmem_max when
	// the process has CAP_NET_ADMIN, else capped there by the kernel.
	RcvBuf int
	// Timeout bounds each wait for a reply message; 0 means DefaultTimeout.
	Timeout time.Duration
	// StrictCheck sets NETLINK_GET_STRICT_CHK, with which rtnetlink
	// filters dumps by the header's fields (an address dump by link
	// index). Kernels without it (before 4.20) ignore the option; callers
	// filter what comes back anyway.
	StrictCheck bool
	// NetNS is the file descriptor of the network namespace the sockets
	// are opened in (a socket stays in the namespace it was made in);
	// 0 is the process's own.
	NetNS int
}

// Handler gets one reply message: its netlink type and its payload (after
// the netlink header). data is only valid during the call: the receive
// buffer is reused. A non-nil error ends the request with that error.
type Handler func(typ uint16, data []byte) error

// Conn sends netlink requests and reads their replies, one request at a
// time on its socket. A dump that finds the socket busy (another
// goroutine's request, or a walk whose callback starts another walk)
// opens a socket of its own for its duration instead of waiting, so
// nested dumps cannot deadlock. Conn is safe for concurrent use.
type Conn struct {
	cfg  Config
	dial func() (Socket, error)
	seq  atomic.Uint32

	mu   sync.Mutex // held for a whole request/reply exchange on main
	main session
}

// Socket is the system-call side of a Conn: a netlink socket, or a
// scripted kernel in tests (package nlconntest).
type Socket interface {
	// Send sends one request.
	Send(b []byte) error
	// Recv reads one datagram into b; a datagram larger than b is an
	// error. When nothing arrives within the timeout it returns EAGAIN.
	Recv(b []byte) (int, error)
	Close() error
}

// session is one socket and its receive buffer. After a failure that may
// leave replies unread (a timeout, lost messages, a callback that gave
// up mid-dump) the socket is closed, and the next request opens a new one:
// the kernel ends a dump whose socket is closed, and nothing stale can
// arrive on the new one.
type session struct {
	sock Socket
	buf  []byte
	lens []int // datagram lengths of a multi-datagram receive, made on first use
}

// Dial opens a Conn and its first socket, so a missing privilege or
// protocol shows at start.
func Dial(cfg Config) (*Conn, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	c := NewConn(cfg, func() (Socket, error) { return dialFD(cfg) })
	sock, err := c.dial()
	if err != nil {
		return nil, err
	}
	c.main.sock = sock
	return c, nil
}

// NewConn returns a Conn whose sockets dial opens, the first on first
// use: tests pass a scripted kernel. Dial is the constructor for real
// sockets.
func NewConn(cfg Config, dial func() (Socket, error)) *Conn {
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Conn{cfg: cfg, dial: dial, main: session{buf: make([]byte, readBuf)}}
}

// Close closes the socket; the Conn must not be used after.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.main.drop()
}

// Execute sends req and passes each reply message to f (nil ignores
// them) until the kernel acknowledges (nil), reports an error (a
// syscall.Errno), ends a dump (ErrDumpInterrupted when the kernel
// flagged it) or sends its single reply. It waits for the socket when
// another request is in flight.
func (c *Conn) Execute(req *nl.NetlinkRequest, f Handler) error {
	return c.ExecuteReport(req, f, nil)
}

// ErrorReport gets the payload of an error acknowledgement after its
// errno: the request's netlink header and, unless the kernel capped it,
// the request itself, as the kernel echoed it. Some families write into
// the echo where a request failed (ipset's batched adds name the failing
// element's line there). echo is only valid during the call.
type ErrorReport func(errno unix.Errno, echo []byte)

// ExecuteReport is Execute that also hands an error acknowledgement's
// echo to report (nil ignores it) before returning its errno.
func (c *Conn) ExecuteReport(req *nl.NetlinkRequest, f Handler, report ErrorReport) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exchange(&c.main, req, f, report)
}

// Dump runs the dump request req, passing each message to f. When the
// kernel flags the dump interrupted by a concurrent change or replies
// were lost (ENOBUFS), it calls reset and starts again, DumpAttempts
// times at most; reset must drop everything f has received. With a nil
// reset it does not restart. When it gives up the error wraps
// ErrDumpInterrupted.
func (c *Conn) Dump(req *nl.NetlinkRequest, reset func(), f Handler) error {
	return c.dump(req, reset, f, false)
}

// DumpAmidWrites is Dump for a reader that learns another way of the
// writes made while it reads (a full pass's journal of the proxy's own
// writes): a dump the kernel flags inconsistent is taken as it came, not
// read again. rtnetlink flags every dump of all links' addresses during
// which any address of the namespace was bound or unbound, so such a dump
// read beside a busy writer would otherwise fail every attempt. What such a dump may hold is
// the caller's to accept: an object deleted during it seen or missed (the
// kernel resumes each batch by position), one added seen or not. Lost
// replies (ENOBUFS) still restart it.
func (c *Conn) DumpAmidWrites(req *nl.NetlinkRequest, reset func(), f Handler) error {
	return c.dump(req, reset, f, true)
}

func (c *Conn) dump(req *nl.NetlinkRequest, reset func(), f Handler, amidWrites bool) error {
	s, release, err := c.session()
	if err != nil {
		return err
	}
	defer release()
	for attempt := 1; ; attempt++ {
		err := c.exchange(s, req, f, nil)
		if amidWrites && errors.Is(err, ErrDumpInterrupted) {
			return nil // exchange reports the flag only once the dump ended
		}
		if !errors.Is(err, ErrDumpInterrupted) && !errors.Is(err, unix.ENOBUFS) {
			return err
		}
		if reset == nil || attempt == DumpAttempts {
			return giveUp(err, attempt)
		}
		reset()
	}
}

// session returns the main session when it is free, else a fresh one
// that release closes.
func (c *Conn) session() (*session, func(), error) {
	if c.mu.TryLock() {
		return &c.main, c.mu.Unlock, nil
	}
	sock, err := c.dial()
	if err != nil {
		return nil, nil, err
	}
	s := &session{sock: sock, buf: make([]byte, readBuf)}
	return s, func() { _ = s.drop() }, nil
}

func giveUp(err error, attempts int) error {
	if errors.Is(err, ErrDumpInterrupted) {
		if attempts == 1 {
			return err
		}
		return fmt.Errorf("%w (%d attempts)", err, attempts)
	}
	return fmt.Errorf("%w (%d attempts, the last: %w)", ErrDumpInterrupted, attempts, err)
}

// exchange is one request and its replies on s.
func (c *Conn) exchange(s *session, req *nl.NetlinkRequest, f Handler, report ErrorReport) error {
	if err := c.ensureSocket(s); err != nil {
		return err
	}
	seq := c.seq.Add(1)
	req.Seq = seq
	return c.exchangeBytes(s, req.Serialize(), seq, f, report)
}

// exchangeBytes sends b, messages numbered seq, on s (dialled) and
// reads their replies.
func (c *Conn) exchangeBytes(s *session, b []byte, seq uint32, f Handler, report ErrorReport) error {
	err := s.sock.Send(b)
	for errors.Is(err, unix.EINTR) {
		err = s.sock.Send(b)
	}
	if err != nil {
		_ = s.drop()
		return fmt.Errorf("netlink send: %w", err)
	}
	r := reply{seq: seq, f: f, report: report}
	for !r.done {
		// A signal interrupting the system call (EINTR) is retried: with a
		// socket timeout set, the kernel does not restart it itself, and
		// the Go runtime signals its threads often (preemption).
		n, err := s.sock.Recv(s.buf)
		for errors.Is(err, unix.EINTR) {
			n, err = s.sock.Recv(s.buf)
		}
		if err != nil {
			_ = s.drop()
			if errors.Is(err, unix.EAGAIN) {
				return fmt.Errorf("netlink receive: %w (%v)", ErrTimeout, c.cfg.Timeout)
			}
			return fmt.Errorf("netlink receive: %w", err)
		}
		r.datagram(s.buf[:n])
	}
	if r.unread {
		_ = s.drop()
	}
	return r.err
}

// ensureSocket dials s's socket when it has none.
func (c *Conn) ensureSocket(s *session) error {
	if s.sock != nil {
		return nil
	}
	sock, err := c.dial()
	if err != nil {
		return err
	}
	s.sock = sock
	return nil
}

// reply follows the messages answering one request.
type reply struct {
	seq         uint32
	f           Handler
	report      ErrorReport
	interrupted bool  // a message carried NLM_F_DUMP_INTR
	done        bool  // the answer is complete (or abandoned)
	unread      bool  // replies may still be queued: drop the socket
	err         error // the request's outcome, once done
}

// datagram handles the messages of one datagram. Messages of other
// requests (an earlier request abandoned midway, on a socket reused by
// a test) are skipped.
func (r *reply) datagram(b []byte) {
	native := nl.NativeEndian()
	for !r.done && len(b) >= unix.NLMSG_HDRLEN {
		l := int(native.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			r.finish(fmt.Errorf("netlink receive: malformed message (length %d of %d bytes)", l, len(b)), true)
			return
		}
		typ, flags, seq := native.Uint16(b[4:]), native.Uint16(b[6:]), native.Uint32(b[8:])
		data := b[unix.NLMSG_HDRLEN:l]
		b = b[min(nlmsgAlign(l), len(b)):]
		if seq != r.seq {
			continue
		}
		r.interrupted = r.interrupted || flags&unix.NLM_F_DUMP_INTR != 0
		r.message(typ, flags, data)
	}
}

func (r *reply) message(typ, flags uint16, data []byte) {
	switch typ {
	case unix.NLMSG_NOOP:
	case unix.NLMSG_DONE:
		// A dump that failed after it started reports the errno here.
		if errno := errnoOf(data); errno != 0 {
			r.finish(errno, false)
		} else if r.interrupted {
			r.finish(ErrDumpInterrupted, false)
		} else {
			r.finish(nil, false)
		}
	case unix.NLMSG_ERROR:
		if len(data) < 4 {
			r.finish(errors.New("netlink receive: short error message"), true)
		} else if errno := errnoOf(data); errno != 0 {
			if r.report != nil {
				r.report(errno, data[4:])
			}
			r.finish(errno, flags&unix.NLM_F_MULTI != 0)
		} else {
			r.finish(nil, false) // the acknowledgement
		}
	case unix.NLMSG_OVERRUN:
		r.finish(unix.ENOBUFS, true)
	default:
		multi := flags&unix.NLM_F_MULTI != 0
		if r.f == nil {
			if !multi {
				r.finish(nil, false)
			}
		} else if err := r.f(typ, data); err != nil {
			r.finish(err, multi)
		} else if !multi {
			r.finish(nil, false)
		}
	}
}

func (r *reply) finish(err error, unread bool) {
	r.done, r.err, r.unread = true, err, unread
}

// errnoOf reads the negative errno leading an NLMSG_ERROR or NLMSG_DONE
// payload; 0 when there is none.
func errnoOf(data []byte) unix.Errno {
	if len(data) < 4 {
		return 0
	}
	if v := int32(nl.NativeEndian().Uint32(data)); v < 0 {
		return unix.Errno(-v)
	}
	return 0
}

// nlmsgAlign rounds a message length up to NLMSG_ALIGNTO.
func nlmsgAlign(l int) int { return (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

func (s *session) drop() error {
	if s.sock == nil {
		return nil
	}
	err := s.sock.Close()
	s.sock = nil
	return err
}
