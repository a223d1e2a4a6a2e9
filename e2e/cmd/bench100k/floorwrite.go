//go:build e2e

package main

// The floor's writer: the captured objects (floor.go) written into a
// fresh network namespace as fast as raw netlink allows. IPVS, ipsets,
// links and addresses are all per namespace, so the new one starts
// empty, and a netlink socket keeps the namespace it was opened in. It
// sends the proxy's very requests (the adapters' exported encoders), but
// none of the proxy's logic: addresses, virtual servers and real servers
// pipelined (nlconn.ExecutePipelined: up to nlconn.MaxPipelined messages
// per sendto, the acknowledgements read with recvmmsg), set entries
// batched many per message by package ipset (32 KiB messages of
// hundreds of entries; two such messages at most would fit one
// pipelined send, so pipelining them would save nothing that counts).

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

const (
	floorLink = dummyif.DefaultLinkName // the proxy's, read and written
	// floorRcvBuf: the acknowledgements of a whole pipelined send
	// (nlconn.MaxPipelined of ~1.1 KiB) fit many times over, so the
	// sends are as deep as nlconn goes.
	floorRcvBuf = 4 << 20
	// floorChunk messages are encoded before they go to the pipeline:
	// a million real servers at once would be ~120 MB of messages.
	floorChunk = 4096
)

// inFreshNetns runs fn on a goroutine locked to its OS thread, in a new
// network namespace, and puts the thread back. Whatever fn opens stays
// in that namespace; the namespace goes when fn's sockets are closed
// and the thread has left. If the thread cannot be put back it stays
// locked, and the runtime ends it with the goroutine: no other
// goroutine ever runs in the floor's namespace.
func inFreshNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("new network namespace: %w", err)
			return
		}
		err = fn()
		ns.Close()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("back to the first network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// writeFloor writes o into a fresh network namespace, timing each
// object type, then empties it, untimed. A phase that cannot start (a
// socket, the link) ends the writing; refused objects are counted in
// their phase.
func writeFloor(o *floorObjects) (phases []floorPhase, teardown time.Duration, err error) {
	err = inFreshNetns(func() error {
		var werr error
		for _, write := range []func(*floorObjects) ([]floorPhase, error){floorAddresses, floorSets, floorIPVS} {
			ph, err := write(o)
			phases = append(phases, ph...)
			if err != nil {
				werr = err
				break
			}
		}
		if werr == nil {
			werr = floorVerify(o)
		}
		start := time.Now()
		floorTeardown(o)
		teardown = time.Since(start)
		return werr
	})
	return phases, teardown, err
}

// floorPipe hands whole messages to nlconn's pipeline floorChunk at a
// time, counting refusals in its phase.
type floorPipe struct {
	conn    *nlconn.Conn
	ph      *floorPhase
	buf     []byte
	n       int
	lastLog time.Time
}

func newFloorPipe(conn *nlconn.Conn, ph *floorPhase) *floorPipe {
	return &floorPipe{conn: conn, ph: ph, lastLog: time.Now()}
}

// added counts the message just appended to p.buf and sends the chunk
// once it is full.
func (p *floorPipe) added() error {
	if p.n++; p.n >= floorChunk {
		return p.flush()
	}
	return nil
}

func (p *floorPipe) flush() error {
	if p.n == 0 {
		return nil
	}
	err := p.conn.ExecutePipelined(p.buf, func(_ int, err error, _ []byte) {
		if err != nil {
			p.ph.fail(err)
		}
	})
	p.ph.Messages += p.n
	p.buf, p.n = p.buf[:0], 0
	if err != nil { // not a run of messages: a bug of the encoder
		return fmt.Errorf("floor %s: %w", p.ph.Name, err)
	}
	if time.Since(p.lastLog) >= 10*time.Second {
		logf("floor: %s: %d of %d written, %d refused", p.ph.Name, p.ph.Messages, p.ph.Objects, p.ph.Errors)
		p.lastLog = time.Now()
	}
	return nil
}

// floorAddresses creates kube-ipvs0 as the proxy does and binds every
// address, pipelined.
func floorAddresses(o *floorObjects) ([]floorPhase, error) {
	ph := floorPhase{Name: "addresses on " + floorLink, Objects: len(o.Addrs)}
	start := time.Now()
	err := writeAddresses(o, &ph)
	ph.Seconds = time.Since(start).Seconds()
	logf("floor: %s", ph)
	return []floorPhase{ph}, err
}

func writeAddresses(o *floorObjects, ph *floorPhase) error {
	d, err := dummyif.New(floorLink)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.EnsureLink(); err != nil {
		return err
	}
	link, err := netlink.LinkByName(floorLink)
	if err != nil {
		return fmt.Errorf("floor: look up %s: %w", floorLink, err)
	}
	conn, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: floorRcvBuf})
	if err != nil {
		return err
	}
	defer conn.Close()
	p := newFloorPipe(conn, ph)
	for _, a := range o.Addrs {
		p.buf = dummyif.AppendAddAddressMessage(p.buf, link.Attrs().Index, a)
		if err := p.added(); err != nil {
			return err
		}
	}
	return p.flush()
}

// floorSets creates every set with the header the kernel reported
// (final sizes: no growth on the way) and adds its entries.
func floorSets(o *floorObjects) ([]floorPhase, error) {
	ph := floorPhase{Name: "set entries", Objects: o.entryCount(), Sets: len(o.Sets)}
	start := time.Now()
	n, err := ipset.New()
	if err != nil {
		return []floorPhase{ph}, err
	}
	defer n.Close()
	for _, s := range o.Sets {
		ph.Messages++
		if err := n.EnsureSet(s.Set); err != nil {
			ph.fail(err)
		}
	}
	lastLog, done := time.Now(), 0
	for _, s := range o.Sets {
		err := n.AddEntries(s.Name, s.Entries)
		ph.Messages += setMessages(s.Name, s.Entries)
		var ee *ipset.EntriesError
		if errors.As(err, &ee) {
			for _, f := range ee.Failed {
				ph.fail(f.Err)
			}
		} else if err != nil {
			ph.fail(err)
		}
		if done += len(s.Entries); time.Since(lastLog) >= 10*time.Second {
			logf("floor: %s: %d of %d written, %d refused", ph.Name, done, ph.Objects, ph.Errors)
			lastLog = time.Now()
		}
	}
	ph.Seconds = time.Since(start).Seconds()
	logf("floor: %s", ph)
	return []floorPhase{ph}, nil
}

// floorIPVS creates every virtual server, then every real server, each
// a pipeline of its own so that each type is timed: the kernel applies
// a pipeline's messages in order, so every virtual server exists before
// its first real server is sent.
func floorIPVS(o *floorObjects) ([]floorPhase, error) {
	vs := floorPhase{Name: "virtual servers", Objects: len(o.VS)}
	rs := floorPhase{Name: "real servers", Objects: o.realCount()}
	start := time.Now()
	family, err := ipvs.FamilyID()
	if err != nil {
		return []floorPhase{vs, rs}, fmt.Errorf("floor: the IPVS netlink family: %w", err)
	}
	conn, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_GENERIC, RcvBuf: floorRcvBuf})
	if err != nil {
		return []floorPhase{vs, rs}, err
	}
	defer conn.Close()
	p := newFloorPipe(conn, &vs)
	for _, v := range o.VS {
		p.buf = ipvs.AppendAddVirtualServerMessage(p.buf, family, v.VirtualServer)
		if err := p.added(); err != nil {
			return []floorPhase{vs, rs}, err
		}
	}
	err = p.flush()
	vs.Seconds = time.Since(start).Seconds()
	if err != nil {
		return []floorPhase{vs, rs}, err
	}
	logf("floor: %s", vs)
	start = time.Now()
	p = newFloorPipe(conn, &rs)
	for _, v := range o.VS {
		for _, r := range v.Reals {
			p.buf = ipvs.AppendAddRealServerMessage(p.buf, family, v.ServiceKey, r)
			if err := p.added(); err != nil {
				return []floorPhase{vs, rs}, err
			}
		}
	}
	err = p.flush()
	rs.Seconds = time.Since(start).Seconds()
	logf("floor: %s", rs)
	return []floorPhase{vs, rs}, err
}

// floorVerify counts, untimed, the addresses and virtual servers in the
// floor's namespace: the acknowledgements said each was created, this
// says it was created here (two dumps; the real servers would take one
// per virtual server).
func floorVerify(o *floorObjects) error {
	start := time.Now()
	d, err := dummyif.New(floorLink)
	if err != nil {
		return err
	}
	defer d.Close()
	addrs, err := d.ListAddresses()
	if err != nil {
		return fmt.Errorf("floor: list its addresses: %w", err)
	}
	v, err := ipvs.New()
	if err != nil {
		return err
	}
	defer v.Close()
	vss, err := v.ListVirtualServers()
	if err != nil {
		return fmt.Errorf("floor: list its virtual servers: %w", err)
	}
	logf("floor: its namespace holds %d addresses (want %d) and %d virtual servers (want %d); counted in %.1fs",
		len(addrs), len(o.Addrs), len(vss), len(o.VS), time.Since(start).Seconds())
	if len(addrs) != len(o.Addrs) || len(vss) != len(o.VS) {
		return fmt.Errorf("floor: its namespace holds %d addresses and %d virtual servers, want %d and %d",
			len(addrs), len(vss), len(o.Addrs), len(o.VS))
	}
	return nil
}

// floorTeardown empties the floor's namespace, each step logged with
// its time: IPVS (freeing a million real servers takes a while), the
// sets, then kube-ipvs0 with its addresses. What fails is logged; the
// kernel frees the rest with the namespace.
func floorTeardown(o *floorObjects) {
	step := func(what string, f func() error) {
		start := time.Now()
		err := f()
		logf("floor teardown: %s in %.1fs (%v)", what, time.Since(start).Seconds(), err)
	}
	step(fmt.Sprintf("IPVS flushed (%d virtual servers, %d real servers)", len(o.VS), o.realCount()), func() error {
		h, err := mobyipvs.New("")
		if err != nil {
			return err
		}
		defer h.Close()
		return h.Flush()
	})
	step(fmt.Sprintf("%d sets destroyed", len(o.Sets)), func() error {
		n, err := ipset.New()
		if err != nil {
			return err
		}
		defer n.Close()
		var errs []error
		for _, s := range o.Sets {
			errs = append(errs, n.DestroySet(s.Name))
		}
		return errors.Join(errs...)
	})
	step(fmt.Sprintf("%s deleted with its %d addresses", floorLink, len(o.Addrs)), func() error {
		d, err := dummyif.New(floorLink)
		if err != nil {
			return err
		}
		defer d.Close()
		return d.DeleteLink()
	})
}
