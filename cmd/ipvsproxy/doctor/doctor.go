// Package doctor checks a node for what ipvsproxy needs and for what
// commonly goes wrong around it: kernel modules, the IPVS and conntrack
// sysctls, set sizes, the iptables backend, and what kube-router left
// behind. It only reads; `ipvsproxy doctor` prints one screen of it.
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/dummyif"
	"github.com/ipvsproxy/ipvsproxy/ipset"
	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// Status is a check's outcome.
type Status string

// The outcomes, worst last.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
}

// Node is what the checks read; each field is a real reader on a node and
// a fake in tests.
type Node struct {
	KernelRelease string                 // uname -r
	Module        func(name string) bool // loaded or built in (/sys/module/NAME)
	LinkExists    func(name string) bool // a network interface of that name
	Sysctl        sysctl.Interface       // /proc/sys
	Sets          ipset.Interface        // the kernel's ipsets; nil when they cannot be read
	SetsErr       error                  // why Sets is nil
	Dummy         dummyif.Interface      // kube-ipvs0
	Backend       func() (string, error) // the iptables backend in use (detected as kube-proxy's wrapper does)
	// Save is iptables-save of one table with one backend ("legacy" or
	// "nft"), IPv4; it finds the other backend's users and kube-proxy's
	// iptables-mode leftovers.
	Save      func(backend, table string) ([]byte, error)
	Scheduler string                 // --ipvs-scheduler
	OwnedSet  func(name string) bool // whether ipvsproxy owns the set
	// NFTables is set with --rules-backend=nftables: whether the kernel
	// can hold the table (nftrules.Probe). Then Sets is the table's
	// ipset view, and the iptables checks are skipped.
	NFTables func() error
}

// Run runs every check.
func Run(n Node) []Check {
	var out []Check
	out = append(out, kernel(n.KernelRelease))
	out = append(out, modules(n)...)
	out = append(out, sysctls(n)...)
	out = append(out, conntrackFill(n.Sysctl))
	if n.NFTables != nil {
		out = append(out, nftables(n.NFTables))
	} else {
		out = append(out, backend(n)...)
	}
	sets, lbEntries := setFill(n)
	out = append(out, sets...)
	out = append(out, strictARP(n, lbEntries), addresses(n.Dummy))
	return append(out, kubeRouterLeftovers(n)...)
}

// Worst is the worst status among checks.
func Worst(checks []Check) Status {
	w := OK
	for _, c := range checks {
		if c.Status == Fail || (c.Status == Warn && w == OK) {
			w = c.Status
		}
	}
	return w
}

// WriteText prints one line per check.
func WriteText(w io.Writer, checks []Check) error {
	width := 0
	for _, c := range checks {
		width = max(width, len(c.Name))
	}
	for _, c := range checks {
		if _, err := fmt.Fprintf(w, "%-4s  %-*s  %s\n", c.Status, width, c.Name, c.Detail); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the checks as a JSON array.
func WriteJSON(w io.Writer, checks []Check) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(checks)
}

// KernelVersion parses a release such as "6.12.3-amd64" into 6, 12.
func KernelVersion(release string) (major, minor int, ok bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return ma, mi, err1 == nil && err2 == nil
}

func kernel(release string) Check {
	ma, mi, ok := KernelVersion(release)
	switch {
	case !ok:
		return Check{"kernel", Warn, fmt.Sprintf("cannot read the version from %q", release)}
	case ma < 5 || ma == 5 && mi < 9:
		return Check{"kernel", OK, release + " (before 5.9: conn_reuse_mode=0 is set, as kube-proxy does)"}
	}
	return Check{"kernel", OK, release}
}

func modules(n Node) []Check {
	sets := "ip_set"
	if n.NFTables != nil {
		sets = "nf_tables"
	}
	want := []string{"ip_vs", "ip_vs_" + n.Scheduler, sets, "nf_conntrack", "dummy"}
	var missing []string
	for _, m := range want {
		if !n.Module(m) {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return []Check{{"kernel modules", Fail, "not loaded: " + strings.Join(missing, ", ") +
			" (ipvsproxy's container cannot load modules: the privileged init container or the host must)"}}
	}
	return []Check{{"kernel modules", OK, strings.Join(want, ", ")}}
}

// nftables: the nftables backend needs nf_tables with the inet family
// and nat chains, which a kernel may lack (the 6.1 sandbox kernel does).
func nftables(probe func() error) Check {
	if err := probe(); err != nil {
		return Check{"nftables", Fail, err.Error()}
	}
	return Check{"nftables", OK, "the kernel holds an inet table with nat and filter base chains (--rules-backend=nftables)"}
}
