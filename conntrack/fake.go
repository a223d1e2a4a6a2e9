package conntrack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/ipvsproxy/ipvsproxy/internal/calls"
)

// Verbs counted by Fake.
const (
	// VerbDeleteUDP counts DeleteUDP calls.
	VerbDeleteUDP = "DeleteUDP"
	// VerbDump counts conntrack table reads: Netlink makes one per
	// DeleteUDP call that has flows, so an engine test can assert it
	// batched (Count(VerbDump) == 1 per sync).
	VerbDump = "Dump"
	// VerbDelete counts single-entry deletions attempted.
	VerbDelete = "Delete"
)

// Entry is one conntrack entry in the Fake's table: the original tuple
// (client → service) and the reply tuple (backend → client, once IPVS or
// DNAT rewrote it).
type Entry struct {
	Proto              uint8 // IP protocol number; 17 is UDP
	OrigSrc, OrigDst   netip.AddrPort
	ReplySrc, ReplyDst netip.AddrPort
	Timeout            uint32 // seconds left, printed by String
	Replied, Assured   bool   // [UNREPLIED] is printed when !Replied
	Mark               uint32
}

// UDPEntry is the entry a client's datagram to vip leaves when IPVS (or
// DNAT) sent it to backend: a replied UDP flow with a 30 s timeout, as the
// kernel's default UDP timeout leaves it.
func UDPEntry(client, vip, backend netip.AddrPort) Entry {
	return Entry{
		Proto:   protoUDP,
		OrigSrc: client, OrigDst: vip,
		ReplySrc: backend, ReplyDst: client,
		Timeout: 30, Replied: true,
	}
}

// Call describes one Fake call, for its Faults: VerbDeleteUDP with
// Flows, or VerbDelete with the Entry about to be deleted.
type Call struct {
	Verb  string
	Flows []Flow
	Entry Entry
}

// Fake is an in-memory Cleaner with a settable table. It matches with the
// same code as Netlink, records what it deleted and counts calls. It is
// safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	entries []Entry
	deleted []Entry
	calls.Counter
	// Faults fails chosen calls (FailOn, FailTimes) and records them
	// (Record). A fault on VerbDeleteUDP fails the call with nothing
	// deleted; on VerbDelete that entry stays and the call goes on with
	// the others, then reports the failure, as Netlink does.
	calls.Faults[Call]
}

var _ Cleaner = (*Fake)(nil)

// NewFake returns a Fake with an empty table.
func NewFake() *Fake {
	f := &Fake{}
	f.Verbs(VerbDeleteUDP, VerbDelete)
	return f
}

// SetEntries replaces the table.
func (f *Fake) SetEntries(entries ...Entry) {
	f.mu.Lock()
	f.entries = slices.Clone(entries)
	f.mu.Unlock()
}

// Entries returns the table as it is now.
func (f *Fake) Entries() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.entries)
}

// Deleted returns every entry deleted so far, in deletion order.
func (f *Fake) Deleted() []Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// DeleteUDP implements Cleaner.
func (f *Fake) DeleteUDP(flows []Flow) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Inc(VerbDeleteUDP)
	if err := f.Check(VerbDeleteUDP, Call{Verb: VerbDeleteUDP, Flows: slices.Clone(flows)}); err != nil {
		return 0, err
	}
	m, err := newMatcher(flows)
	if err != nil || m.families == 0 {
		return 0, err
	}
	f.Inc(VerbDump)
	deleted, failed := 0, 0
	var first error
	kept := f.entries[:0:0]
	for _, e := range f.entries {
		if !m.match(e.Proto, e.OrigDst, e.ReplySrc.Addr()) {
			kept = append(kept, e)
			continue
		}
		f.Inc(VerbDelete)
		if err := f.Check(VerbDelete, Call{Verb: VerbDelete, Entry: e}); err != nil {
			failed++
			if first == nil {
				first = fmt.Errorf("delete conntrack entry %s: %w", e.OrigDst, err)
			}
			kept = append(kept, e)
			continue
		}
		deleted++
		f.deleted = append(f.deleted, e)
	}
	f.entries = kept
	if failed > 0 {
		return deleted, fmt.Errorf("%d of %d conntrack deletions failed, first: %w", failed, failed+deleted, first)
	}
	return deleted, nil
}

// String prints the table as `conntrack -L` does (without its trailing
// summary line on stderr), one entry per line in table order.
func (f *Fake) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, e := range f.entries {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// String is the entry's `conntrack -L` line.
func (e Entry) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %d %d ", protoName(e.Proto), e.Proto, e.Timeout)
	fmt.Fprintf(&b, "src=%s dst=%s sport=%d dport=%d ", e.OrigSrc.Addr(), e.OrigDst.Addr(), e.OrigSrc.Port(), e.OrigDst.Port())
	if !e.Replied {
		b.WriteString("[UNREPLIED] ")
	}
	fmt.Fprintf(&b, "src=%s dst=%s sport=%d dport=%d ", e.ReplySrc.Addr(), e.ReplyDst.Addr(), e.ReplySrc.Port(), e.ReplyDst.Port())
	if e.Assured {
		b.WriteString("[ASSURED] ")
	}
	fmt.Fprintf(&b, "mark=%d use=1", e.Mark)
	return b.String()
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case protoUDP:
		return "udp"
	case 132:
		return "sctp"
	}
	return "unknown"
}
