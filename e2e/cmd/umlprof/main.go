//go:build e2e

// Command umlprof reads a host `perf record` of a user-mode-Linux guest
// (e2e/sandbox/uml-profile makes one) and tells where the guest's time
// went: in the guest's kernel, by function (its /proc/kallsyms, modules
// included), in the guest's programs, by function (their ELF symbols),
// and in the host's kernel on the guest's behalf (user-mode Linux traps
// every guest system call and page fault through ptrace, and switches
// host processes to run them).
//
// Why not the proxy's own CPU profile: under user-mode Linux Go's
// profiler saw a quarter of a start-up batch's wall time, and nothing of
// the guest kernel's work on the proxy's behalf (docs/benchmarks.md);
// the host's sampler sees every host thread of the guest.
//
//	umlprof --perf perf.data --kallsyms kallsyms --kernel linux [--binary PATH]... [--top N]
//	        [--from HH:MM:SS[.ffffff]] [--to HH:MM:SS[.ffffff]]
//
// --from and --to keep the samples of a window, in UTC time of day as
// klog prints it (the guest's clock is the host's): a proxy's start-up
// from its first log line to its "Ready" line, say. The record must use
// the real-time clock (perf record -k CLOCK_REALTIME; uml-profile does).
package main

import (
	"bufio"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"
)

type binaries []string

func (b *binaries) String() string     { return strings.Join(*b, ",") }
func (b *binaries) Set(s string) error { *b = append(*b, s); return nil }

func main() {
	var perfData, kallsyms, kernel string
	var bins binaries
	top := flag.Int("top", 40, "functions listed per part")
	flag.StringVar(&perfData, "perf", "perf.data", "the host's perf record of the guest")
	flag.StringVar(&kallsyms, "kallsyms", "kallsyms", "the guest's /proc/kallsyms, read after the command")
	flag.StringVar(&kernel, "kernel", "", "the user-mode-Linux binary the guest ran (perf names it as the samples' file)")
	flag.Var(&bins, "binary", "a guest program whose functions to name (repeatable; static, non-PIE: Go's)")
	from := flag.String("from", "", "keep samples from this UTC time of day (HH:MM:SS[.ffffff])")
	to := flag.String("to", "", "keep samples until this UTC time of day")
	flag.Parse()
	win, err := parseWindow(*from, *to)
	if err == nil {
		err = run(os.Stdout, perfData, kallsyms, kernel, bins, *top, win)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "umlprof:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, perfData, kallsyms, kernel string, bins []string, top int, win window) error {
	ks, err := readKallsyms(kallsyms)
	if err != nil {
		return err
	}
	var progs []*symtab
	for _, b := range bins {
		st, err := readELF(b)
		if err != nil {
			return err
		}
		progs = append(progs, st)
	}
	cmd := exec.Command("perf", "script", "-i", perfData, "-F", "pid,time,ip,sym,dso")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p := newProfile(ks, progs, kernel)
	p.win = win
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		p.add(sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("perf script: %w", err)
	}
	p.write(w, top)
	return sc.Err()
}

// part is where a sample's time was spent.
type part int

const (
	guestKernel part = iota // the guest kernel's code (the UML binary's text)
	guestUser               // a guest program's code
	hostKernel              // the host kernel, for the guest's host processes
	parts
)

var partNames = [parts]string{
	"guest kernel (by function; [module] as in kallsyms)",
	"guest programs (by function of the --binary files; others: [unknown])",
	"host kernel on the guest's behalf (ptrace traps, process switches, page faults)",
}

type profile struct {
	ks     *symtab
	progs  []*symtab
	kernel string
	win    window
	hosts  map[int]*hostProc
	total  int
	n      [parts]int
	funcs  [parts]map[string]int
}

func newProfile(ks *symtab, progs []*symtab, kernel string) *profile {
	p := &profile{ks: ks, progs: progs, kernel: kernel, hosts: map[int]*hostProc{}}
	for i := range p.funcs {
		p.funcs[i] = map[string]int{}
	}
	return p
}

// add counts one `perf script -F pid,time,ip,sym,dso` line:
// "PID SECONDS.MICROS: ADDR SYMBOL (DSO)", the time since the epoch;
// perf names the host kernel's symbols, the guest's are named here.
func (p *profile) add(line string) {
	f := strings.Fields(line)
	if len(f) < 4 {
		return
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return
	}
	at, err := strconv.ParseFloat(strings.TrimSuffix(f[1], ":"), 64)
	if err != nil || !p.win.holds(at) {
		return
	}
	ip, err := strconv.ParseUint(f[2], 16, 64)
	if err != nil {
		return
	}
	dso := strings.Trim(f[len(f)-1], "()")
	sym := strings.Join(f[3:len(f)-1], " ")
	pt, name := p.classify(ip, sym, dso)
	p.total++
	p.n[pt]++
	p.funcs[pt][name]++
	h := p.hosts[pid]
	if h == nil {
		h = &hostProc{pid: pid, funcs: map[string]int{}}
		p.hosts[pid] = h
	}
	h.n[pt]++
	if pt == guestUser {
		h.funcs[name]++
	}
}

// hostProc is one host process of the guest: the guest kernel's, or one
// per guest address space (a guest program, threads and all).
type hostProc struct {
	pid   int
	n     [parts]int
	funcs map[string]int // guest-user samples by function
}

func (h *hostProc) total() int { return h.n[guestKernel] + h.n[guestUser] + h.n[hostKernel] }

func (p *profile) classify(ip uint64, sym, dso string) (part, string) {
	switch {
	case strings.HasPrefix(dso, "[kernel"):
		return hostKernel, sym
	case (p.kernel != "" && dso == p.kernel) || p.ks.contains(ip):
		if name, ok := p.ks.lookup(ip); ok {
			return guestKernel, name
		}
		return guestKernel, "[unknown]"
	}
	for _, st := range p.progs {
		if name, ok := st.lookup(ip); ok {
			return guestUser, st.name + ": " + name
		}
	}
	return guestUser, "[unknown]"
}

func (p *profile) write(w io.Writer, top int) {
	if p.total == 0 {
		fmt.Fprintln(w, "no samples")
		return
	}
	pct := func(n int) float64 { return 100 * float64(n) / float64(p.total) }
	fmt.Fprintf(w, "%d samples\n", p.total)
	for pt := range parts {
		fmt.Fprintf(w, "%6.1f%%  %s\n", pct(p.n[pt]), partNames[pt])
	}
	p.writeHosts(w, pct)
	for pt := range parts {
		if p.n[pt] == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %.1f%% of all samples\n", partNames[pt], pct(p.n[pt]))
		type fn struct {
			name string
			n    int
		}
		var fns []fn
		for name, n := range p.funcs[pt] {
			fns = append(fns, fn{name, n})
		}
		sort.Slice(fns, func(i, j int) bool { return fns[i].n > fns[j].n || fns[i].n == fns[j].n && fns[i].name < fns[j].name })
		for i, f := range fns {
			if i == top {
				break
			}
			fmt.Fprintf(w, "%6.1f%%  %s\n", pct(f.n), f.name)
		}
	}
}

// writeHosts lists the host processes by their share, with each one's
// busiest guest function: user-mode Linux runs the guest kernel in one
// host process and each guest address space in another, so this tells
// the proxy from the API server though every Go program's functions sit
// at the same addresses (a --binary names each sample by the first
// binary with a function there; the process's top functions say which
// program it is). Processes under 1 % are summed.
func (p *profile) writeHosts(w io.Writer, pct func(int) float64) {
	hosts := make([]*hostProc, 0, len(p.hosts))
	for _, h := range p.hosts {
		hosts = append(hosts, h)
	}
	sort.Slice(hosts, func(i, j int) bool {
		return hosts[i].total() > hosts[j].total() || hosts[i].total() == hosts[j].total() && hosts[i].pid < hosts[j].pid
	})
	fmt.Fprintf(w, "\nby host process (guest kernel / guest program / host kernel), its busiest guest functions:\n")
	rest := 0
	for _, h := range hosts {
		if pct(h.total()) < 1 {
			rest += h.total()
			continue
		}
		fmt.Fprintf(w, "%6.1f%%  pid %d (%.1f / %.1f / %.1f)%s\n", pct(h.total()), h.pid,
			pct(h.n[guestKernel]), pct(h.n[guestUser]), pct(h.n[hostKernel]), topNames(h.funcs, 3))
	}
	if rest > 0 {
		fmt.Fprintf(w, "%6.1f%%  other processes\n", pct(rest))
	}
}

// topNames is "  a, b, c": the n busiest names of funcs.
func topNames(funcs map[string]int, n int) string {
	names := make([]string, 0, len(funcs))
	for name := range funcs {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		return funcs[names[i]] > funcs[names[j]] || funcs[names[i]] == funcs[names[j]] && names[i] < names[j]
	})
	if len(names) > n {
		names = names[:n]
	}
	if len(names) == 0 {
		return ""
	}
	return "  " + strings.Join(names, ", ")
}

// window keeps the samples between two UTC times of day, as seconds
// since midnight; the zero window keeps every sample.
type window struct {
	from, to float64
	set      bool
}

func parseWindow(from, to string) (window, error) {
	if from == "" && to == "" {
		return window{}, nil
	}
	w := window{to: 24 * 3600, set: true}
	for _, v := range []struct {
		s   string
		dst *float64
	}{{from, &w.from}, {to, &w.to}} {
		if v.s == "" {
			continue
		}
		t, err := time.Parse("15:04:05.999999", v.s)
		if err != nil {
			return window{}, fmt.Errorf("--from/--to %q: want HH:MM:SS[.ffffff] (UTC)", v.s)
		}
		*v.dst = float64(t.Hour()*3600+t.Minute()*60+t.Second()) + float64(t.Nanosecond())/1e9
	}
	return w, nil
}

// holds reports whether a sample at epoch seconds at is in the window (a
// window across midnight is not supported).
func (w window) holds(at float64) bool {
	if !w.set {
		return true
	}
	day := at - 86400*float64(int64(at)/86400)
	return day >= w.from && day <= w.to
}

// symtab is a sorted table of function start addresses.
type symtab struct {
	name       string
	addrs      []uint64
	names      []string
	start, end uint64 // text range, for telling the guest kernel's addresses
}

func (s *symtab) sort() {
	idx := make([]int, len(s.addrs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return s.addrs[idx[a]] < s.addrs[idx[b]] })
	addrs, names := make([]uint64, len(idx)), make([]string, len(idx))
	for i, j := range idx {
		addrs[i], names[i] = s.addrs[j], s.names[j]
	}
	s.addrs, s.names = addrs, names
	if len(addrs) > 0 {
		s.start, s.end = addrs[0], addrs[len(addrs)-1]+1<<20
	}
}

func (s *symtab) contains(ip uint64) bool { return ip >= s.start && ip < s.end }

// lookup names the function holding ip: the last symbol at or below it.
func (s *symtab) lookup(ip uint64) (string, bool) {
	if !s.contains(ip) {
		return "", false
	}
	i := sort.Search(len(s.addrs), func(i int) bool { return s.addrs[i] > ip }) - 1
	if i < 0 {
		return "", false
	}
	return s.names[i], true
}

// readKallsyms reads the text symbols of /proc/kallsyms: "ADDR T name [module]".
func readKallsyms(path string) (*symtab, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := &symtab{name: "guest kernel"}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 || (fs[1] != "t" && fs[1] != "T") {
			continue
		}
		a, err := strconv.ParseUint(fs[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		name := fs[2]
		if len(fs) > 3 {
			name += " " + fs[3]
		}
		st.addrs, st.names = append(st.addrs, a), append(st.names, name)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(st.addrs) == 0 {
		return nil, fmt.Errorf("%s: no text symbols (read as root? kptr_restrict hides them otherwise)", path)
	}
	st.sort()
	return st, nil
}

// readELF reads a program's function symbols.
func readELF(path string) (*symtab, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	base := path[strings.LastIndex(path, "/")+1:]
	st := &symtab{name: base}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
			st.addrs, st.names = append(st.addrs, s.Value), append(st.names, s.Name)
		}
	}
	st.sort()
	return st, nil
}
