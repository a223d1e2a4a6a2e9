//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// TestRulesBackendSwitch switches a running node from the suite's rules
// backend to the other one and back (stop the proxy, start it with the
// other --rules-backend), while a client outside the cluster CIDR (its
// requests need the masquerade rules) keeps requesting a ClusterIP
// service. IPVS stays in the kernel across a restart, and the proxy
// removes the old backend only after its first full pass has written the
// new one, so no request may fail; and nothing of the old backend is
// left: no KUBE- chain or ipset, or no table inet ipvsproxy.
func TestRulesBackendSwitch(t *testing.T) {
	from, to := framework.RulesBackend(), framework.OtherBackend()
	shared := proxy(t)
	pods := startPods(t, "switch", 2, []int{8080}, nil)
	c := startClient(t, "switch", "10.20.9.2")
	ts := createService(t, namespace(t), "switch", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	expectAllAnswer(t, c.GetTCP, ts.VIP, 80, 4, pods)
	loop := startLoop(t, c.GetTCP, ts.VIP, 80, 20*time.Millisecond)

	if err := shared.Stop(); err != nil {
		t.Fatal(err)
	}
	other := shared.WithArgs(filepath.Join(results, "ipvsproxy-switch-"+to+".log"), "--rules-backend", to)
	t.Cleanup(func() {
		_ = other.Stop()
		if !shared.Running() {
			if err := shared.Start(); err != nil {
				t.Errorf("restarting the shared proxy: %v", err)
			}
		}
	})
	began := time.Now()
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, passTimeout, "switched to "+to, func() error { return onlyBackend(ts, to, from) })
	t.Logf("FIGURE switch: %s to %s, old backend gone after %v", from, to, time.Since(began).Round(time.Millisecond))

	if err := other.Stop(); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	if err := shared.Start(); err != nil {
		t.Fatal(err)
	}
	waitKernel(t, passTimeout, "switched back to "+from, func() error { return onlyBackend(ts, from, to) })
	t.Logf("FIGURE switch: %s back to %s, old backend gone after %v", to, from, time.Since(began).Round(time.Millisecond))

	tally := loop.Stop()
	t.Logf("FIGURE switch: requests during both switches: %v", tally)
	if len(tally.Errors) > 0 || tally.Total() == 0 {
		t.Errorf("requests failed during the switches: %v", tally)
	}
	expectAllAnswer(t, c.GetTCP, ts.VIP, 80, 4, pods)
}

// onlyBackend checks that backend holds the service (its ClusterIP set
// entry and its rules) and nothing of old is left.
func onlyBackend(ts *testService, backend, old string) error {
	m, err := framework.SetMembersIn(backend, "KUBE-CLUSTER-IP")
	if err != nil {
		return err
	}
	if entry := ts.VIP + ",tcp:80"; !m[entry] {
		return fmt.Errorf("%s: no %s in the ClusterIP set", backend, entry)
	}
	if rules, err := framework.ProxyRulesIn(backend); err != nil || len(rules) == 0 {
		return fmt.Errorf("%s: no rules (%v)", backend, err)
	}
	left, err := framework.BackendLeftovers(old)
	if err != nil {
		return err
	}
	if left != "" {
		return fmt.Errorf("left of the %s backend: %s", old, left)
	}
	return nil
}
