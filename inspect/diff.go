package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"

	"github.com/ipvsproxy/ipvsproxy/internal/sorted"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/iptables"
	"github.com/ipvsproxy/ipvsproxy/ipvs"
	"github.com/ipvsproxy/ipvsproxy/nftrules"
	"github.com/ipvsproxy/ipvsproxy/owned"
	"github.com/ipvsproxy/ipvsproxy/sync"
)

// Ops of a Line.
const (
	OpMissing  = "+" // wanted, not in the kernel
	OpExtra    = "-" // owned and in the kernel, not wanted
	OpChanged  = "~" // in the kernel with other attributes
	OpDraining = "#" // a removed backend at weight 0 finishing its connections: expected, not a difference
)

// Line is one difference, in the words of the operator's tools: an
// `ipvsadm -Sn` line, an `ipset save` add line, an address.
type Line struct {
	Op     string `json:"op"`
	Object string `json:"object"` // link, virtual_server, real_server, address, set, set_entry, iptables, nftables
	Text   string `json:"line"`
	Kernel string `json:"kernel,omitempty"` // with OpChanged: the kernel's line
}

// String is the line as `ipvsproxy diff` prints it.
func (l Line) String() string {
	switch l.Op {
	case OpChanged:
		return fmt.Sprintf("~ %s  (kernel: %s)", l.Text, l.Kernel)
	case OpDraining:
		return "# " + l.Text + "  (draining)"
	}
	return l.Op + " " + l.Text
}

// Diff is every difference between desired and actual state, in a stable
// order: the link, virtual servers (each followed by its real servers),
// addresses, sets, set entries, iptables rules or the nftables table.
type Diff struct {
	Lines []Line
}

// Equal reports whether the kernel holds what is desired. Draining real
// servers do not count: the engine keeps them on purpose.
func (d Diff) Equal() bool {
	for _, l := range d.Lines {
		if l.Op != OpDraining {
			return false
		}
	}
	return true
}

// WriteText prints one line per difference.
func (d Diff) WriteText(w io.Writer) error {
	for _, l := range d.Lines {
		if _, err := fmt.Fprintln(w, l.String()); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints {"equal": bool, "differences": [Line...]}.
func (d Diff) WriteJSON(w io.Writer) error {
	lines := d.Lines
	if lines == nil {
		lines = []Line{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Equal       bool   `json:"equal"`
		Differences []Line `json:"differences"`
	}{d.Equal(), lines})
}

// Compare lists what differs between want and have. Only owned kernel
// objects are compared: foreign virtual servers and sets never appear.
func Compare(want *Desired, have *Actual, linkName string) Diff {
	var d Diff
	add := func(op, object, text, kernel string) {
		d.Lines = append(d.Lines, Line{Op: op, Object: object, Text: text, Kernel: kernel})
	}
	if !have.Link {
		add(OpMissing, "link", fmt.Sprintf("link %s type dummy", linkName), "")
	}
	compareVS(want, have, add)
	sorted.Walk(have.Addresses, want.Addresses, netip.Addr.Compare,
		func(a netip.Addr) {
			if !owned.Excluded(have.Exclude, a) {
				add(OpExtra, "address", addrLine(a, linkName), "")
			}
		},
		func(a netip.Addr) { add(OpMissing, "address", addrLine(a, linkName), "") },
		func(_, _ netip.Addr) {})
	types := map[string]ipset.Type{}
	for _, s := range have.Sets {
		types[s.Name] = s.Type
	}
	for _, s := range have.Missing {
		types[s.Name] = s.Type
		add(OpMissing, "set", createLine(s), "")
	}
	entryLine := func(e owned.SetEntry) string {
		return fmt.Sprintf("add %s %s", e.Set, e.Entry.Format(types[e.Set]))
	}
	sorted.Walk(have.Entries, want.Entries, owned.CompareSetEntries,
		func(e owned.SetEntry) { add(OpExtra, "set_entry", entryLine(e), "") },
		func(e owned.SetEntry) { add(OpMissing, "set_entry", entryLine(e), "") },
		func(_, _ owned.SetEntry) {})
	return d
}

type addFunc func(op, object, text, kernel string)

// compareVS walks wanted and owned kernel virtual servers in ipvsadm order.
func compareVS(want *Desired, have *Actual, add addFunc) {
	var owned []KernelVS
	for _, kv := range have.VirtualServers {
		if kv.Owned || want.Wants(kv.VS.ServiceKey) {
			owned = append(owned, kv)
		}
	}
	sorted.Walk(owned, want.VirtualServers,
		func(k KernelVS, w sync.VirtualServerState) int {
			return ipvs.CompareServiceKeys(k.VS.ServiceKey, w.VS.ServiceKey)
		},
		func(k KernelVS) {
			add(OpExtra, "virtual_server", ipvs.ServiceLine(k.VS), "")
			for _, rs := range k.Reals {
				add(OpExtra, "real_server", ipvs.RealLine(k.VS.ServiceKey, rs), "")
			}
		},
		func(w sync.VirtualServerState) {
			add(OpMissing, "virtual_server", ipvs.ServiceLine(w.VS), "")
			for _, rs := range w.Reals {
				add(OpMissing, "real_server", ipvs.RealLine(w.VS.ServiceKey, rs), "")
			}
		},
		func(k KernelVS, w sync.VirtualServerState) {
			if !k.VS.Equal(w.VS) {
				add(OpChanged, "virtual_server", ipvs.ServiceLine(w.VS), ipvs.ServiceLine(k.VS))
			}
			compareReals(w.VS.ServiceKey, k.Reals, w.Reals, add)
		})
}

func compareReals(vs ipvs.ServiceKey, have, want []ipvs.RealServer, add addFunc) {
	sorted.Walk(have, want, func(a, b ipvs.RealServer) int { return ipvs.CompareRealKeys(a.RealKey, b.RealKey) },
		func(rs ipvs.RealServer) {
			op := OpExtra
			if rs.Weight == 0 {
				op = OpDraining
			}
			add(op, "real_server", ipvs.RealLine(vs, rs), "")
		},
		func(rs ipvs.RealServer) { add(OpMissing, "real_server", ipvs.RealLine(vs, rs), "") },
		func(h, w ipvs.RealServer) {
			if h.Weight != w.Weight {
				add(OpChanged, "real_server", ipvs.RealLine(vs, w), ipvs.RealLine(vs, h))
			}
		})
}

func addrLine(a netip.Addr, link string) string {
	return fmt.Sprintf("addr %s dev %s", a, link)
}

// createLine is the set's `ipset save` create line (without comment).
func createLine(s ipset.Set) string {
	if s.Type == ipset.BitmapPort {
		from, to := s.PortFrom, s.PortTo
		if from == 0 && to == 0 {
			to = 65535
		}
		return fmt.Sprintf("create %s %s range %d-%d", s.Name, s.Type, from, to)
	}
	return fmt.Sprintf("create %s %s family %s hashsize %d maxelem %d", s.Name, s.Type, s.Family, s.HashSize, s.MaxElem)
}

// RuleLines turns the fixed iptables rules' drift into diff lines, after
// the kernel objects' (Compare): an iptables command per difference.
func RuleLines(drift []iptables.Drift) []Line {
	lines := make([]Line, 0, len(drift))
	for _, d := range drift {
		l := Line{Op: OpMissing, Object: "iptables", Text: d.Rule}
		switch d.Op {
		case iptables.DriftExtra:
			l.Op = OpExtra
		case iptables.DriftOrder:
			l.Op, l.Kernel = OpChanged, "the same rules in another order"
		}
		lines = append(lines, l)
	}
	return lines
}

// TableLines turns the nftables table's drift into diff lines, as
// RuleLines the iptables rules': the table, chain or set as nft names
// it, and with OpChanged how the kernel's differs.
func TableLines(drift []nftrules.Drift) []Line {
	lines := make([]Line, 0, len(drift))
	for _, d := range drift {
		l := Line{Op: OpMissing, Object: "nftables", Text: d.Object}
		switch d.Op {
		case nftrules.DriftExtra:
			l.Op = OpExtra
		case nftrules.DriftChanged:
			l.Op, l.Kernel = OpChanged, d.How
		}
		lines = append(lines, l)
	}
	return lines
}
