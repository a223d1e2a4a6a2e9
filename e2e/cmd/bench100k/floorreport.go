//go:build e2e

package main

import (
	"cmp"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// floorTarget is issue 20's: start → kernel complete within 2× the floor.
const floorTarget = 2.0

// floorPhase is one object type written by the floor.
type floorPhase struct {
	Name       string  `json:"name"`
	Objects    int     `json:"objects"`        // asked for
	Sets       int     `json:"sets,omitempty"` // set entries: the sets created first
	Messages   int     `json:"messages"`       // netlink messages sent
	Seconds    float64 `json:"seconds"`
	Errors     int     `json:"errors"` // objects refused, or whose acknowledgement was lost
	FirstError string  `json:"firstError,omitempty"`
}

func (p *floorPhase) fail(err error) {
	if p.Errors++; p.FirstError == "" {
		p.FirstError = err.Error()
	}
}

func (p floorPhase) String() string {
	s := fmt.Sprintf("%s: %d in %.1fs (%.0f/s), %d messages", p.Name, p.Objects, p.Seconds, perSecond(p.Objects, p.Seconds), p.Messages)
	if p.Errors > 0 {
		s += fmt.Sprintf(", %d REFUSED (first: %s)", p.Errors, p.FirstError)
	}
	return s
}

func perSecond(n int, s float64) float64 {
	if s <= 0 {
		return 0
	}
	return float64(n) / s
}

// floorReport is the floor measured in the run (floor.go).
type floorReport struct {
	Skipped        string       `json:"skipped,omitempty"`
	CaptureSeconds float64      `json:"captureSeconds"` // the untimed read of the proxy's objects
	VSDump         dumpTiming   `json:"vsDump"`         // that read's dump of the virtual servers (dumptiming.go)
	SettleSeconds  float64      `json:"settleSeconds"`  // waited after flushing the proxy's IPVS
	Phases         []floorPhase `json:"phases"`
	Seconds        float64      `json:"seconds"` // the phases' sum
	Objects        int          `json:"objects"` // addresses, set entries, virtual and real servers
	PerSecond      float64      `json:"objectsPerSecond"`
	// Ratio is (start → kernel complete) / Seconds; RatioLow the same
	// from the read before, which found the kernel incomplete (0: none).
	// The kernel became complete between the two.
	Ratio    float64 `json:"ratio"`
	RatioLow float64 `json:"ratioLow"`
	// ReadyRatio is /readyz's first 200 over Seconds, when no IPVS read
	// begun after it found the kernel incomplete (0: not confirmed, or
	// never ready). The reads that confirm it take seconds at 10,000
	// services, so Ratio alone cannot tell a start-up of a few seconds
	// from one of twenty.
	ReadyRatio      float64 `json:"readyRatio"`
	TeardownSeconds float64 `json:"teardownSeconds"` // untimed: emptying the floor's namespace
	Error           string  `json:"error,omitempty"`
	// Receive is the receive floor (receivefloor.go); ReadyBothRatio is
	// /readyz's first 200 over the two floors' sum (0: ReadyRatio is, or
	// the receive floor failed).
	Receive        receiveFloor `json:"receive"`
	ReadyBothRatio float64      `json:"readyBothRatio"`
}

// finish sums the phases and sets the ratios against prog and against
// ready, /readyz's first 200 (-1: never).
func (f *floorReport) finish(prog programmed, ready float64) {
	f.Seconds, f.Objects = 0, 0
	for _, p := range f.Phases {
		f.Seconds += p.Seconds
		f.Objects += p.Objects
	}
	f.PerSecond = perSecond(f.Objects, f.Seconds)
	if f.Seconds > 0 {
		f.Ratio = prog.Seconds / f.Seconds
		if prog.PrevReadSeconds > 0 {
			f.RatioLow = prog.PrevReadSeconds / f.Seconds
		}
		if _, early := readyVerdict(ready, prog); ready > 0 && prog.Seconds > 0 && !early {
			f.ReadyRatio = ready / f.Seconds
		}
	}
}

// addReceive adds the receive floor and the ratio of /readyz's first
// 200 (ready) to both floors.
func (f *floorReport) addReceive(rf receiveFloor, ready float64) {
	f.Receive = rf
	if f.ReadyRatio > 0 && rf.Error == "" && rf.Seconds > 0 {
		f.ReadyBothRatio = ready / (f.Seconds + rf.Seconds)
	}
}

// readyRow is the summary's row of ReadyRatio, the proxy's own claim checked
// against the kernel.
func (f *floorReport) readyRow(ready float64, prog programmed) (string, string) {
	const k = "/readyz first 200 / floor (the proxy's claim, checked by the IPVS reads after it)"
	if f.ReadyRatio <= 0 {
		text, _ := readyVerdict(ready, prog)
		return k, "not confirmed: " + text
	}
	verdict := "met"
	if f.ReadyRatio > floorTarget {
		verdict = "MISSED"
	}
	return k, fmt.Sprintf("%.2f× (%.1f s / %.1f s): target ≤ %.0f× %s", f.ReadyRatio, ready, f.Seconds, floorTarget, verdict)
}

// verdict is the 2× target check: met when even the upper bound of the
// ratio is within it, missed when even the lower bound is not.
func (f *floorReport) verdict() string {
	switch {
	case f.Seconds <= 0 || f.Ratio <= 0:
		return "not checked"
	case f.Ratio <= floorTarget:
		return "met"
	case f.RatioLow > floorTarget:
		return "MISSED"
	}
	return "undecided (the kernel became complete between the two reads)"
}

func (r *report) floorMarkdown(b *strings.Builder) {
	f := r.Floor
	if f.Seconds <= 0 {
		var why []string
		for _, s := range []string{f.Skipped, f.Error} {
			if s != "" {
				why = append(why, s)
			}
		}
		if why == nil {
			why = []string{"the run ended before the proxy was stopped"}
		}
		fmt.Fprintf(b, "\nFloor (issue 20): not measured: %s\n", strings.Join(why, "; "))
		return
	}
	row := func(k, format string, v ...any) { fmt.Fprintf(b, "| %s | "+format+" |\n", append([]any{k}, v...)...) }
	b.WriteString("\nFloor (issue 20): the proxy's objects, read back once it had stopped, written again by a raw pipelined netlink writer into a fresh network namespace of the same kernel\n\n")
	b.WriteString("| floor | objects | messages | seconds | objects/s | refused |\n|---|---:|---:|---:|---:|---:|\n")
	for _, p := range f.Phases {
		name := p.Name
		if p.Sets > 0 {
			name += fmt.Sprintf(" (%d sets created first)", p.Sets)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %.1f | %.0f | %d |\n", name, p.Objects, p.Messages, p.Seconds, perSecond(p.Objects, p.Seconds), p.Errors)
	}
	fmt.Fprintf(b, "| total | %d | | %.1f | %.0f | |\n\n", f.Objects, f.Seconds, f.PerSecond)
	b.WriteString("| measure | value |\n|---|---:|\n")
	low := "no earlier read"
	if f.RatioLow > 0 {
		low = fmt.Sprintf("%.2f× from the read before, which found it incomplete", f.RatioLow)
	}
	row("start → kernel complete / floor", "%.2f× (%.1f s / %.1f s; %s)", f.Ratio, r.Programmed.Seconds, f.Seconds, low)
	row("start → kernel complete within 2× the floor", "target ≤ %.0f× %s", floorTarget, f.verdict())
	k, v := f.readyRow(r.Startup.ReadyzSeconds, r.Programmed)
	row(k, "%s", v)
	r.receiveRows(row)
	row("floor: capture (untimed read) / wait after flushing the proxy's IPVS / teardown (s)", "%.1f / %.1f / %.1f",
		f.CaptureSeconds, f.SettleSeconds, f.TeardownSeconds)
	if f.VSDump.Services > 0 {
		row("the capture's dump of the virtual servers, the proxy stopped (waits between two are the kernel filling the next message; this guest's kernel does not preempt)", "%v", f.VSDump)
	}
	if f.Error != "" {
		row("floor error", "%s", f.Error)
	}
}

// receiveRows are the receive floor's rows: what no client-go proxy
// can beat on this guest, beside the ratio.
func (r *report) receiveRows(row func(k, format string, v ...any)) {
	rf := r.Floor.Receive
	const k = "receive floor: a bare client's watch-lists of the Services and EndpointSlices, both at once, every object decoded and dropped (s)"
	if rf.Error != "" || rf.Seconds <= 0 {
		row(k, "not measured: %s", cmp.Or(rf.Error, "the run ended before it"))
		return
	}
	row(k, "%.1f (%d services, %d slices)", rf.Seconds, rf.Services, rf.Slices)
	if f := r.Floor; f.ReadyBothRatio > 0 {
		row("/readyz first 200 / (floor + receive floor)", "%.2f× (%.1f s / %.1f s)",
			f.ReadyBothRatio, r.Startup.ReadyzSeconds, f.Seconds+rf.Seconds)
	}
}

// captureForFloor reads what the proxy left in the kernel, untimed, once
// it has stopped; nil when the kernel never was complete (there is no
// ratio to report then) or the read failed (recorded in r.Floor).
func captureForFloor(r *report) *floorObjects {
	if !r.Programmed.IPVS.done() || r.Programmed.Seconds <= 0 {
		r.Floor.Skipped = "the kernel was never complete"
		return nil
	}
	start := time.Now()
	o, err := captureWithAdapters()
	r.Floor.CaptureSeconds = time.Since(start).Seconds()
	if err != nil {
		r.Floor.Error = "capture: " + err.Error()
		logf("floor: capture failed after %.1fs: %v", r.Floor.CaptureSeconds, err)
		return nil
	}
	r.Floor.VSDump = o.VSDump
	logf("floor: captured %v in %.1fs (untimed); the dump of %v", o, r.Floor.CaptureSeconds, o.VSDump)
	return o
}

func captureWithAdapters() (*floorObjects, error) {
	v, err := ipvs.New()
	if err != nil {
		return nil, err
	}
	defer v.Close()
	s, err := ipset.New()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	d, err := dummyif.New(floorLink)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return captureKernel(v, s, d, func(msg string) { logf("floor: capture: %s", msg) })
}

// measureFloor writes o in a fresh namespace (writeFloor) and reports it
// against the proxy's start → kernel complete. It runs after the proxy's
// IPVS was flushed (IPVS hashes every namespace's virtual servers in one
// table: the proxy's 100,000 left in it would lengthen every lookup the
// floor's writes make) and the freed real servers were let go
// (settleAfterFlush).
func measureFloor(o *floorObjects, flushed time.Time, r *report) error {
	if o == nil {
		if r.Floor.Error != "" {
			return errors.New(r.Floor.Error)
		}
		return nil
	}
	r.Floor.SettleSeconds = settleAfterFlush(flushed, o.realCount()).Seconds()
	phases, teardown, err := writeFloor(o)
	// A floor written into the proxy's namespace by mistake would find
	// the addresses and sets there (EEXIST) but an empty IPVS.
	if n, verr := mainVirtualServers(); verr != nil || n != 0 {
		err = errors.Join(err, fmt.Errorf("the proxy's namespace holds %d virtual servers after the floor, want 0: flushed before it", n), verr)
	}
	r.Floor.Phases, r.Floor.TeardownSeconds = phases, teardown.Seconds()
	r.Floor.finish(r.Programmed, r.Startup.ReadyzSeconds)
	for _, p := range phases {
		if p.Errors > 0 {
			err = errors.Join(err, fmt.Errorf("%s: %d refused (first: %s)", p.Name, p.Errors, p.FirstError))
		}
	}
	if err != nil {
		r.Floor.Error = err.Error()
	}
	logf("floor: %d objects in %.1fs (%.0f/s); start → kernel complete %.1fs is %.2f× the floor (target ≤ %.0f×: %s); teardown %.1fs",
		r.Floor.Objects, r.Floor.Seconds, r.Floor.PerSecond, r.Programmed.Seconds, r.Floor.Ratio, floorTarget, r.Floor.verdict(), r.Floor.TeardownSeconds)
	return err
}

// destTrashFreed is how long after a flush IPVS may take to free the
// deleted real servers: they wait in the namespace's trash list (for
// connections that may still point at them), whose timer runs every
// IP_VS_DEST_TRASH_PERIOD/2 (60 s) and frees a server once it has been
// seen idle for a whole period (120 s): the first run after the flush
// marks them, the third frees them, ~180 s after it, a million frees in
// softirq: CPU the floor's timing must not share.
const destTrashFreed = 190 * time.Second

// settleMinReals: with fewer real servers flushed, the frees cost
// milliseconds and the floor does not wait for them.
const settleMinReals = 100000

// settleAfterFlush waits until destTrashFreed after the flush, then
// (at most a minute more) until the kernel's slab stops shrinking (the
// frees go through RCU), and returns how long it waited.
func settleAfterFlush(flushed time.Time, reals int) time.Duration {
	start := time.Now()
	if reals < settleMinReals {
		logf("floor: not waiting for IPVS to free the proxy's %d real servers (fewer than %d)", reals, settleMinReals)
		return 0
	}
	slab := func() int { return readMeminfo()["SlabKB"] / 1024 }
	before := slab()
	logf("floor: waiting until %.0fs after the flush for IPVS to free the proxy's %d real servers (slab %d MB)",
		destTrashFreed.Seconds(), reals, before)
	for left := destTrashFreed - time.Since(flushed); left > 0; left = destTrashFreed - time.Since(flushed) {
		time.Sleep(min(left, 10*time.Second))
	}
	prev := slab()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		time.Sleep(2 * time.Second)
		cur := slab()
		if prev-cur < 1 {
			break
		}
		prev = cur
	}
	logf("floor: slab %d MB → %d MB after %.1fs", before, slab(), time.Since(start).Seconds())
	return time.Since(start)
}

// mainVirtualServers counts the virtual servers of this thread's
// namespace, the proxy's.
func mainVirtualServers() (int, error) {
	v, err := ipvs.New()
	if err != nil {
		return 0, err
	}
	defer v.Close()
	vss, err := v.ListVirtualServers()
	return len(vss), err
}
