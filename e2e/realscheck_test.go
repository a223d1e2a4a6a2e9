//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

// realsCheckPeriod is the --ipvs-real-server-check-period of the test
// below: three sync periods, so that each pass reads about a third of the
// services' real servers.
const realsCheckPeriod = 3 * framework.SyncPeriod

// With --ipvs-real-server-check-period the full passes read the real
// servers back in turn: a real server deleted by hand from each of four
// services is put back within the period (each service's when its window
// comes) and then takes traffic again, while a virtual server deleted by
// hand is put back by the next pass, as without the setting. The proxy's
// log shows passes that took real servers from their records.
func TestRealServerDriftRepairedWithinCheckPeriod(t *testing.T) {
	p := proxyWith(t, "realscheck", "--ipvs-real-server-check-period", realsCheckPeriod.String())
	pods := startPods(t, "realscheck", 2, []int{8080}, nil)
	ns := namespace(t)
	var services []*testService
	for i := range 4 {
		services = append(services, createService(t, ns, fmt.Sprintf("realscheck-%d", i), pods, httpPort))
	}
	for _, ts := range services {
		waitKernel(t, programTimeout, "service programmed", ts.kernelMatches)
	}

	gone := net.JoinHostPort(pods[0].IP, "8080")
	for _, ts := range services {
		if _, err := framework.Run("ipvsadm", "-d", "-t", net.JoinHostPort(ts.VIP, "80"), "-r", gone); err != nil {
			t.Fatal(err)
		}
	}
	// Deleted last, so that the pass that restores it began after the
	// real servers were deleted.
	if _, err := framework.Run("ipvsadm", "-D", "-t", net.JoinHostPort(services[3].VIP, "80")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitKernel(t, passTimeout, "the deleted virtual server restored by the next pass", services[3].kernelMatches)
	for i, ts := range services[:3] {
		// The period, then the pass that reads the last window: on a
		// loaded host a pass takes seconds.
		waitKernel(t, realsCheckPeriod+passTimeout-time.Since(start), fmt.Sprintf("service %d's real server restored", i), ts.kernelMatches)
	}
	t.Logf("FIGURE real-server drift in 3 services repaired within %v (check period %v, sync period %v)",
		time.Since(start).Round(time.Second), realsCheckPeriod, framework.SyncPeriod)
	for _, ts := range services {
		expectAllAnswer(t, framework.GetTCP, ts.VIP, 80, 10, pods)
	}

	fromRecords, err := realsFromRecords(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if fromRecords == 0 {
		t.Errorf("no full pass took a virtual server's real servers from its records (%s): every pass read them all", p.LogPath)
	}
}

var realsFromRecordsRe = regexp.MustCompile(`"Full pass done".* realsFromRecords=(\d+)`)

// realsFromRecords is the largest realsFromRecords of the "Full pass
// done" lines in the proxy's log.
func realsFromRecords(logPath string) (int, error) {
	data, err := os.ReadFile(logPath)
	if err != nil {
		return 0, err
	}
	most := 0
	for _, m := range realsFromRecordsRe.FindAllSubmatch(data, -1) {
		n, _ := strconv.Atoi(string(m[1]))
		most = max(most, n)
	}
	return most, nil
}
