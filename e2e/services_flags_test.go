//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Issue 4, node-wide flags against the real kernel: --ipvs-strict-arp,
// the IPVS timeouts, --ipvs-exclude-cidrs, and a scheduler whose kernel
// module is missing. Each test that needs other flags stops the shared
// proxy, runs its own, and restarts the shared one when it ends.

// flaggedProxies runs proxies with extra flags in place of the shared one.
type flaggedProxies struct {
	t      *testing.T
	shared *framework.Proxy
	cur    *framework.Proxy
}

// withFlags stops the shared proxy; when the test ends, the proxy it
// started last is stopped and the shared one started again.
func withFlags(t *testing.T) *flaggedProxies {
	t.Helper()
	f := &flaggedProxies{t: t, shared: proxy(t)}
	if err := f.shared.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f.cur != nil {
			if err := f.cur.Stop(); err != nil {
				t.Errorf("stopping ipvsproxy with %v: %v", f.cur.Args[len(f.shared.Args):], err)
			}
		}
		if err := f.shared.Start(); err != nil {
			t.Errorf("restarting the shared proxy: %v", err)
		}
	})
	return f
}

// start runs a proxy with the shared one's flags plus extra (stopping the
// previous one), logging to ipvsproxy-TEST.log in the results folder.
func (f *flaggedProxies) start(extra ...string) *framework.Proxy {
	f.t.Helper()
	if f.cur != nil {
		if err := f.cur.Stop(); err != nil {
			f.t.Fatal(err)
		}
	}
	f.cur = f.shared.WithArgs(filepath.Join(results, "ipvsproxy-"+f.t.Name()+".log"), extra...)
	if err := f.cur.Start(); err != nil {
		f.t.Fatalf("ipvsproxy %v: %v", extra, err)
	}
	f.t.Logf("ipvsproxy running with %v", extra)
	return f.cur
}

// --ipvs-strict-arp: after start, arp_ignore=1 and arp_announce=2 on
// "all" (set to 0 first, so the proxy must have written them).
func TestIPVSStrictARP(t *testing.T) {
	f := withFlags(t)
	want := map[string]string{"net/ipv4/conf/all/arp_ignore": "1", "net/ipv4/conf/all/arp_announce": "2"}
	for name := range want {
		was, err := framework.Sysctl(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := framework.SetSysctl(name, was); err != nil {
				t.Errorf("restoring %s=%s: %v", name, was, err)
			}
		})
		if err := framework.SetSysctl(name, "0"); err != nil {
			t.Fatal(err)
		}
	}
	f.start("--ipvs-strict-arp")
	for name, v := range want {
		if got, err := framework.Sysctl(name); err != nil || got != v {
			t.Errorf("%s = %q (err %v), want %s", name, got, err, v)
		}
	}
}

// --ipvs-tcp-timeout, --ipvs-tcpfin-timeout, --ipvs-udp-timeout: the
// values > 0 show in `ipvsadm -L --timeout`, a 0 leaves the kernel's
// value alone; services answer TCP and UDP with the new timeouts.
func TestIPVSTimeouts(t *testing.T) {
	f := withFlags(t)
	was, err := framework.IPVSTimeouts()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		v := strings.Fields(was)
		if err := framework.SetIPVSTimeouts(v[0], v[1], v[2]); err != nil {
			t.Errorf("restoring the IPVS timeouts %s: %v", was, err)
		}
	})
	expectTimeouts := func(want string) {
		t.Helper()
		if got, err := framework.IPVSTimeouts(); err != nil || got != want {
			t.Fatalf("ipvsadm -L --timeout: %q (err %v), want %q", got, err, want)
		}
		t.Logf("ipvsadm -L --timeout: %s", want)
	}
	if err := framework.SetIPVSTimeouts("900", "120", "300"); err != nil {
		t.Fatal(err)
	}
	f.start("--ipvs-tcp-timeout", "1000s", "--ipvs-tcpfin-timeout", "130s", "--ipvs-udp-timeout", "400s")
	expectTimeouts("1000 130 400")

	if err := framework.SetIPVSTimeouts("900", "121", "300"); err != nil {
		t.Fatal(err)
	}
	f.start("--ipvs-tcp-timeout", "1100s") // tcpfin and udp stay 0
	expectTimeouts("1100 121 300")

	pods := startPods(t, "timeouts", 2, []int{8080}, []int{5353})
	waitUDPBackends(t, pods, 5353)
	ts := createService(t, namespace(t), "timeouts", pods, httpPort, dnsPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
	expectAllAnswer(t, framework.AskUDP, ts.VIP, 53, 10, pods)
}

// --ipvs-exclude-cidrs: a virtual server someone else made on an address
// in an excluded CIDR bound on kube-ipvs0 survives full passes, with its
// address and real server; a stray one on a kube-ipvs0 address outside
// the CIDR is removed (made after the excluded one, so the pass that
// removed it also saw the excluded one).
func TestIPVSExcludeCIDRs(t *testing.T) {
	f := withFlags(t)
	f.start("--ipvs-exclude-cidrs", "198.51.100.0/24")
	const kept, stray = "198.51.100.10", "203.0.113.60"
	for _, ip := range []string{kept, stray} {
		t.Cleanup(func() {
			_, _ = framework.Run("ipvsadm", "-D", "-t", ip+":80")
			_ = framework.DelAddr("kube-ipvs0", ip)
		})
	}
	fullPasses := `ipvsproxy_syncs_total{kind="full"}`
	// The strays go in after the first full pass (the proxy has just
	// started: that pass may still be reading the kernel), so only a
	// later pass can remove one.
	waitKernel(t, passTimeout, "the first full pass done", func() error {
		if v := metric(t, fullPasses); v < 1 {
			return fmt.Errorf("%s = %v", fullPasses, v)
		}
		return nil
	})
	before := metric(t, fullPasses)
	for _, ip := range []string{kept, stray} {
		for _, cmd := range [][]string{
			{"ip", "addr", "add", ip + "/32", "dev", "kube-ipvs0"},
			{"ipvsadm", "-A", "-t", ip + ":80", "-s", "wlc"},
			{"ipvsadm", "-a", "-t", ip + ":80", "-r", "10.244.250.1:80", "-m", "-w", "3"},
		} {
			if _, err := framework.Run(cmd[0], cmd[1:]...); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitKernel(t, passTimeout, "stray VS and address removed by a full pass", func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss["TCP "+stray+":80"]; v != nil {
			return fmt.Errorf("stray VS %s still there", v.Key())
		}
		if ok, err := framework.HasAddr("kube-ipvs0", stray); err != nil || ok {
			return fmt.Errorf("stray address %s still on kube-ipvs0 (err %v)", stray, err)
		}
		return nil
	})
	// A pass that removed it counts when it ends (it works in steps).
	waitKernel(t, passTimeout, "the full pass that removed the stray counted", func() error {
		if after := metric(t, fullPasses); after <= before {
			return fmt.Errorf("%s %v -> %v: no full pass ended since the strays were made", fullPasses, before, after)
		}
		return nil
	})
	vss, err := framework.IPVS()
	if err != nil {
		t.Fatal(err)
	}
	v := vss["TCP "+kept+":80"]
	if v == nil || v.Scheduler != "wlc" || v.Reals["10.244.250.1:80"].Weight != 3 {
		t.Errorf("excluded VS %s:80 changed: %+v, want wlc with 10.244.250.1:80 weight 3\n%s", kept, v, framework.DumpKernel())
	}
	if ok, err := framework.HasAddr("kube-ipvs0", kept); err != nil || !ok {
		t.Errorf("excluded address %s gone from kube-ipvs0 (err %v)", kept, err)
	}
}

// hideScheduler makes the IPVS scheduler module mod missing, as on a node
// whose kernel was built without it: the module is unloaded (the guest
// has no /lib/modules/RELEASE, so SchedulerAvailable finds nothing), and
// the kernel's module loader (/proc/sys/kernel/modprobe) refuses it. The
// returned function (also run at cleanup) undoes both.
func hideScheduler(t *testing.T, mod string) (restore func()) {
	t.Helper()
	if _, err := framework.Run("modprobe", "-r", mod); err != nil {
		t.Fatalf("unloading %s (a virtual server still using it?): %v", mod, err)
	}
	loader, err := framework.Sysctl("kernel/modprobe")
	if err != nil {
		t.Fatal(err)
	}
	deny := filepath.Join(t.TempDir(), "modprobe")
	script := fmt.Sprintf("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = %s ] && exit 1; done\nexec %s \"$@\"\n", mod, loader)
	if err := os.WriteFile(deny, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := framework.SetSysctl("kernel/modprobe", deny); err != nil {
		t.Fatal(err)
	}
	done := false
	restore = func() {
		if done {
			return
		}
		done = true
		if err := framework.SetSysctl("kernel/modprobe", loader); err != nil {
			t.Errorf("restoring kernel/modprobe=%s: %v", loader, err)
		}
		if _, err := framework.Run("modprobe", mod); err != nil {
			t.Errorf("reloading %s: %v", mod, err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// A scheduler whose kernel module is missing: --ipvs-scheduler naming it
// stops the proxy at start with one clear line on stderr; a Service whose
// annotation names it is programmed with the default scheduler, answers,
// and gets a Warning Event saying why; once the module is back, the next
// full pass gives it the scheduler it asked for.
func TestSchedulerModuleMissing(t *testing.T) {
	p := proxy(t)
	const sched, mod = "nq", "ip_vs_nq"
	restore := hideScheduler(t, mod)
	if _, err := framework.Run("ipvsadm", "-A", "-t", "192.0.2.30:80", "-s", sched); err == nil {
		_, _ = framework.Run("ipvsadm", "-D", "-t", "192.0.2.30:80")
		t.Fatalf("the kernel still has scheduler %s after hiding %s", sched, mod)
	}

	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(c, p.Path, append(append([]string{}, p.Args...), "--ipvs-scheduler", sched)...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	want := fmt.Sprintf(`ipvsproxy: --ipvs-scheduler %s: IPVS scheduler %q is not available in this kernel: load the %s module (modprobe %s)`, sched, sched, mod, mod)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || lines[len(lines)-1] != want {
		t.Fatalf("ipvsproxy --ipvs-scheduler %s: %v, stderr:\n%s\nwant exit status 1 and the last line %q", sched, err, stderr.String(), want)
	}
	t.Logf("refused at start: %s", want)

	pods := startPods(t, "nosched", 1, []int{8080}, nil)
	ns := namespace(t)
	spec := framework.ClusterIPService(ns, "nosched", httpPort)
	spec.Annotations = map[string]string{"ipvsproxy.io/scheduler": sched}
	ts := applyService(t, spec, pods)
	key := vs(corev1.ProtocolTCP, ts.VIP, 80)
	def := p.Flag("ipvs-scheduler", "rr")
	waitKernel(t, programTimeout, key+" programmed with the default scheduler "+def, func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss[key]; v == nil || v.Scheduler != def || len(v.ActiveReals()) != 1 {
			return fmt.Errorf("%s: %+v, want scheduler %s with one real server", key, v, def)
		}
		return nil
	})
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 4, pods)
	wantEvent := fmt.Sprintf(`scheduler %q is not available in this kernel (load the %s module); using %q`, sched, mod, def)
	if err := framework.Eventually(programTimeout, 200*time.Millisecond, func() error {
		evs, err := cluster.WarningEvents(ctx(t), ns, "nosched")
		if err != nil {
			return err
		}
		for _, e := range evs {
			if strings.Contains(e, wantEvent) {
				t.Logf("Warning Event: %s", e)
				return nil
			}
		}
		return fmt.Errorf("Warning Events %q, want one containing %q", evs, wantEvent)
	}); err != nil {
		t.Fatal(err)
	}

	restore()
	waitKernel(t, 2*passTimeout, key+" switched to "+sched+" once the module is back", func() error {
		vss, err := framework.IPVS()
		if err != nil {
			return err
		}
		if v := vss[key]; v == nil || v.Scheduler != sched || len(v.ActiveReals()) != 1 {
			return fmt.Errorf("%s: %+v, want scheduler %s with one real server", key, v, sched)
		}
		return nil
	})
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 4, pods)
}

// --stats-max-services: per-service traffic metrics are off by default
// (no ipvsproxy_service_* series at all); with the flag the kernel's
// counters of a service's virtual server are exported under its
// namespace and name, and count the connections real traffic made.
func TestServiceTrafficMetrics(t *testing.T) {
	proxy(t)
	ns := namespace(t)
	pods := startPods(t, "stats", 2, []int{8080}, nil)
	ts := createService(t, ns, "stats", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	code, body, err := framework.Healthz(framework.MetricsURL)
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	if strings.Contains(body, "ipvsproxy_service_") {
		t.Error("per-service traffic metrics exported without --stats-max-services")
	}

	f := withFlags(t)
	f.start("--stats-max-services", "100")
	waitKernel(t, programTimeout, "service still programmed", ts.kernelMatches)
	series := fmt.Sprintf(`ipvsproxy_service_connections_total{namespace=%q,port="80",protocol="tcp",service_name="stats",vip=%q}`, ns, ts.VIP)
	before := metric(t, series)
	const requests = 20
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, requests, pods)
	// The collector reads the kernel at most every 10 s.
	waitKernel(t, programTimeout+10*time.Second, fmt.Sprintf("%s counts the %d connections", series, requests), func() error {
		if got := metric(t, series); got < before+requests {
			return fmt.Errorf("%s = %v, want at least %v", series, got, before+requests)
		}
		return nil
	})
}
