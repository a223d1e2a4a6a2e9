//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// TestLeastPrivilege runs ipvsproxy the way deploy/daemonset.yaml does:
// `ipvsproxy prepare-node` first with every privilege (the init
// container), then the proxy with only CAP_NET_ADMIN and CAP_NET_RAW and
// /proc/sys read-only (what a non-privileged container sees). It must
// start, program a service that answers traffic, and repair drift.
func TestLeastPrivilege(t *testing.T) {
	p := proxy(t)
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Start(); err != nil {
			t.Errorf("restarting the regular proxy: %v", err)
		}
	}()
	if out, err := exec.Command(p.Path, append([]string{"prepare-node"}, p.Args...)...).CombinedOutput(); err != nil {
		t.Fatalf("prepare-node: %v\n%s", err, out)
	}

	// unshare/mount need CAP_SYS_ADMIN, so they run first; setpriv then
	// drops every capability but the two from the bounding set, and the
	// exec'd proxy (root, no file capabilities) gets exactly those.
	script := `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys /proc/sys && ` +
		`exec setpriv --bounding-set=-all,+net_admin,+net_raw --inh-caps=-all -- "$@"`
	limited := &framework.Proxy{
		Path:    "unshare",
		Args:    append([]string{"-m", "sh", "-c", script, "sh", p.Path}, p.Args...),
		LogPath: filepath.Join(results, "ipvsproxy-least-privilege.log"),
		Healthz: p.Healthz,
	}
	if err := limited.Start(); err != nil {
		t.Fatalf("ipvsproxy with only NET_ADMIN and NET_RAW: %v", err)
	}
	defer limited.Stop()
	if caps := effectiveCaps(t, limited); caps != "0000000000003000" {
		t.Fatalf("CapEff of the limited proxy = %s, want 0000000000003000 (NET_ADMIN|NET_RAW)", caps)
	}

	pods := startPods(t, "lp", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "lp", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed by the limited proxy", ts.kernelMatches)
	expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
	if _, err := framework.Run("ipvsadm", "-D", "-t", ts.VIP+":80"); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, passTimeout, "drift repaired by the limited proxy", ts.kernelMatches)
}

// effectiveCaps reads CapEff of the proxy: the shell exec'd setpriv, which
// exec'd ipvsproxy, so the pid is the proxy's.
func effectiveCaps(t *testing.T, p *framework.Proxy) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("no CapEff in /proc/PID/status")
	return ""
}
