//go:build e2e

package e2e

import (
	"net"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// Restarting ipvsproxy (gracefully, and by crash) while a client loops on
// the VIP loses no request, and the kernel objects are adopted, not
// re-created: their cumulative counters keep growing instead of resetting.
func TestRestartNoBlip(t *testing.T) {
	p := proxy(t)
	pods := startPods(t, "restart", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "steady", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	vs := vsKey(ts.VIP, ts.svc.Spec.Ports[0])

	for _, c := range []struct {
		name    string
		restart func() error
	}{
		{"SIGTERM", p.Restart},
		{"SIGKILL", func() error {
			if err := p.Kill(); err != nil {
				return err
			}
			return p.Start()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := stats(t)
			loop := framework.StartLoop(framework.GetTCP, ts.VIP, 80, 20*time.Millisecond)
			time.Sleep(time.Second)
			start := time.Now()
			if err := c.restart(); err != nil {
				loop.Stop()
				t.Fatalf("restart: %v", err)
			}
			t.Logf("ipvsproxy back up after %v", time.Since(start).Round(time.Millisecond))
			// Keep the client going through the start-up sync and the
			// first periodic full sync, where a careless proxy flushes.
			time.Sleep(framework.SyncPeriod + 2*time.Second)
			tally := loop.Stop()
			// The kernel folds its per-CPU counters into what ipvsadm
			// reads every 2 s (the rate estimator); wait for that.
			time.Sleep(3 * time.Second)
			after := stats(t)
			t.Logf("client during restart: %v", tally)
			if len(tally.Errors) > 0 {
				t.Errorf("%d requests failed during the restart: %v\n%s", len(tally.Errors), tally, framework.DumpKernel())
			}
			ok := tally.Total() - len(tally.Errors)
			if got, min := after[vs].Conns, before[vs].Conns+uint64(ok); got < min {
				t.Errorf("%s connection counter %d -> %d after %d successful requests: the VS was re-created",
					vs, before[vs].Conns, got, ok)
			}
			// Each connection also counts on the real server that took it:
			// a real server deleted and re-added would lose its share.
			var rsDelta int64
			for _, pod := range pods {
				rs := vs + " -> " + net.JoinHostPort(pod.IP, "8080")
				rsDelta += int64(after[rs].Conns) - int64(before[rs].Conns)
			}
			if rsDelta < int64(ok) {
				t.Errorf("real servers counted %d new connections for %d successful requests: a real server was re-created", rsDelta, ok)
			}
			if err := ts.kernelMatches(); err != nil {
				t.Errorf("after restart: %v\n%s", err, framework.DumpKernel())
			}
			allWeightsPositive(t, vs)
			t.Logf("FIGURE restart %s: client %d requests, %d failed", c.name, tally.Total(), len(tally.Errors))
		})
	}
}

func stats(t *testing.T) map[string]framework.Stats {
	t.Helper()
	s, err := framework.IPVSStats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Drift: kernel objects broken by hand (an operator, other software) are
// repaired by the next full pass, within one sync period, and traffic flows.
func TestDriftRepaired(t *testing.T) {
	proxy(t)
	pods := startPods(t, "drift", 2, []int{8080}, nil)
	ts := createService(t, namespace(t), "drift", pods, httpPort)
	waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	vs := net.JoinHostPort(ts.VIP, "80")
	rs := net.JoinHostPort(pods[0].IP, "8080")

	for _, c := range []struct {
		name    string
		breakIt [][]string
	}{
		{"VS and VIP deleted", [][]string{{"ipvsadm", "-D", "-t", vs}, {"delete-vip"}}},
		{"real server deleted", [][]string{{"ipvsadm", "-d", "-t", vs, "-r", rs}}},
		{"real server weight changed", [][]string{{"ipvsadm", "-e", "-t", vs, "-r", rs, "-m", "-w", "5"}}},
		{"set entry deleted", [][]string{setEntryDelete(ts.VIP)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// A periodic full pass may repair the damage before the check
			// below looks; break it again then (up to three times).
			broken := false
			for attempt := 0; attempt < 3 && !broken; attempt++ {
				for _, cmd := range c.breakIt {
					var err error
					if cmd[0] == "delete-vip" {
						err = framework.DelAddr("kube-ipvs0", ts.VIP)
					} else {
						_, err = framework.Run(cmd[0], cmd[1:]...)
					}
					if err != nil && attempt == 0 {
						t.Fatal(err)
					}
				}
				broken = ts.kernelMatches() != nil
			}
			if !broken {
				t.Fatal("breaking the kernel state by hand had no visible effect")
			}
			// The next full pass must repair it: one sync period, plus time
			// for the pass itself on a single-CPU guest of a loaded host
			// (seen up to ~1.3 s). Half a period of slack still tells "the
			// next pass" from "the one after".
			waitKernel(t, passTimeout, "repaired", ts.kernelMatches)
			expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
		})
	}
}

// setEntryDelete is the command that deletes the ClusterIP entry of
// vip:80/TCP from the backend under test (an IPv4 vip).
func setEntryDelete(vip string) []string {
	if framework.NFTables() {
		return []string{"nft", "delete", "element", "inet", framework.NFTTable, "cluster-ip-v4", "{ " + vip + " . tcp . 80 }"}
	}
	return []string{"ipset", "del", "KUBE-CLUSTER-IP", vip + ",tcp:80"}
}
