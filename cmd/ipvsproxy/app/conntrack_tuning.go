package app

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/ipvsproxy/ipvsproxy/sysctl"
)

// conntrackTuning is kube-proxy's conntrack section (--conntrack-* flags,
// KubeProxyConfiguration conntrack.*). IPVS masquerades through
// conntrack, so a table that fills up drops new connections node-wide;
// operators size it with these settings. A zero value leaves the
// kernel's setting as it is.
type conntrackTuning struct {
	MaxPerCore     int32
	Min            int32
	TCPEstablished time.Duration
	TCPCloseWait   time.Duration
	UDP            time.Duration
	UDPStream      time.Duration
	TCPBeLiberal   bool
}

const (
	sysctlConntrackMax = "net/netfilter/nf_conntrack_max"
	// hashsizeDir holds nf_conntrack's "hashsize" module parameter. It is
	// read through a sysctl.Proc rooted here, so tests use sysctl.Fake.
	hashsizeDir  = "/sys/module/nf_conntrack/parameters"
	hashsizeName = "hashsize"
)

// wantMax is kube-proxy's nf_conntrack_max: max(min, perCore × CPUs), or
// 0 (leave it) when perCore is 0.
func (c conntrackTuning) wantMax(cpus int) int {
	if c.MaxPerCore <= 0 {
		return 0
	}
	return max(int(c.Min), int(c.MaxPerCore)*cpus)
}

// apply sets the conntrack sysctls. A value already at least as large
// as wanted is kept: lowering nf_conntrack_max below what someone else
// chose could drop connections (kube-proxy would lower it). When the
// hash table must grow first and its size is read-only (a container
// without write access to /sys), it says so in one line and leaves
// nf_conntrack_max alone, as kube-proxy does; that is not an error.
func (c conntrackTuning) apply(sc, hashsize sysctl.Interface, cpus int) error {
	if want := c.wantMax(cpus); want > 0 {
		if err := raiseConntrackMax(sc, hashsize, want); err != nil {
			return err
		}
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"net/netfilter/nf_conntrack_tcp_timeout_established", c.TCPEstablished},
		{"net/netfilter/nf_conntrack_tcp_timeout_close_wait", c.TCPCloseWait},
		{"net/netfilter/nf_conntrack_udp_timeout", c.UDP},
		{"net/netfilter/nf_conntrack_udp_timeout_stream", c.UDPStream},
	} {
		if secs := int(t.d / time.Second); secs > 0 {
			if err := setIfDifferent(sc, t.name, secs); err != nil {
				return err
			}
		}
	}
	if c.TCPBeLiberal {
		// Accept out-of-window TCP packets instead of marking them
		// INVALID (and dropping them): kube-proxy's fix for resets on
		// long-lived connections through a masquerading node.
		return setIfDifferent(sc, "net/netfilter/nf_conntrack_tcp_be_liberal", 1)
	}
	return nil
}

func raiseConntrackMax(sc, hashsize sysctl.Interface, want int) error {
	cur, err := getInt(sc, sysctlConntrackMax)
	if err != nil {
		return err
	}
	if cur >= want {
		klog.V(2).InfoS("nf_conntrack_max is already large enough", "current", cur, "wanted", want)
		return nil
	}
	// The hash table should have a bucket per 4 entries (kube-proxy's
	// ratio): a longer chain costs every packet a longer lookup.
	hs, err := getInt(hashsize, hashsizeName)
	if err != nil {
		return err
	}
	if hs < want/4 {
		if err := hashsize.Set(hashsizeName, strconv.Itoa(want/4)); err != nil {
			if !readOnly(err) {
				return fmt.Errorf("conntrack hashsize: %w", err)
			}
			klog.InfoS("Not raising nf_conntrack_max: "+hashsizeDir+"/"+hashsizeName+" is read-only (a container without write access to /sys?); "+
				"the conntrack table may fill up under load. Raise it on the host, or run with /sys writable",
				"nfConntrackMax", cur, "wanted", want, "hashsize", hs, "err", err)
			return nil
		}
		klog.InfoS("Set conntrack hashsize", "hashsize", want/4)
	}
	if err := sc.Set(sysctlConntrackMax, strconv.Itoa(want)); err != nil {
		return err
	}
	klog.InfoS("Set nf_conntrack_max", "value", want, "was", cur)
	return nil
}

func readOnly(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}

func getInt(sc sysctl.Interface, name string) (int, error) {
	s, err := sc.Get(name)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", name, s)
	}
	return v, nil
}

// setIfDifferent writes name only when its value differs, so a node
// already configured sees no write (and a read-only /proc/sys does not
// matter then).
func setIfDifferent(sc sysctl.Interface, name string, v int) error {
	if cur, err := getInt(sc, name); err == nil && cur == v {
		return nil
	}
	if err := sc.Set(name, strconv.Itoa(v)); err != nil {
		return err
	}
	klog.InfoS("Set sysctl", "name", name, "value", v)
	return nil
}

// numCPU counts the machine's online CPUs, not those this process may
// use: the conntrack table serves the whole node, and a CPU-limited
// container would otherwise size it too small (kube-proxy #99225).
func numCPU() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/online"); err == nil {
		if n := countCPUList(string(b)); n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// countCPUList counts a kernel CPU list such as "0-3,6,8-9"; 0 if it
// cannot be read.
func countCPUList(s string) int {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0
			}
		}
		n += b - a + 1
	}
	return n
}
