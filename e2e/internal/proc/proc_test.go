//go:build e2e

package proc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartUsageStop runs a real process: its start is marked in the log,
// its usage is read from /proc while it runs, and after Stop it is
// reported as ended by the signal.
func TestStartUsageStop(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "sleep.log")
	p, err := Start("sleeper", "test", "sleep", []string{"30"}, logPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Exited(); err != nil {
		t.Fatalf("running process reported ended: %v", err)
	}
	// A process that has run has touched pages and been switched out:
	// once sleep has reached its sleep. Right after the start it may not
	// have been switched out yet (a CI run read it at 0 switches).
	u, err := p.Usage()
	for deadline := time.Now().Add(30 * time.Second); err == nil && u.VoluntarySwitches == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		u, err = p.Usage()
	}
	if err != nil || u.RSSKB <= 0 || u.HWMKB < u.RSSKB || u.CPUWithChildren < u.CPUSeconds || u.MinorFaults <= 0 ||
		u.VoluntarySwitches+u.InvoluntarySwitches <= 0 {
		t.Errorf("usage %+v, err %v", u, err)
	}
	p.Stop(5 * time.Second)
	if err := p.Exited(); err == nil || !strings.Contains(err.Error(), "sleeper exited: signal: terminated") {
		t.Errorf("after Stop: %v", err)
	}
	log, _ := os.ReadFile(logPath)
	if !strings.Contains(string(log), "===== test: starting sleep 30 at ") {
		t.Errorf("log does not mark the start: %q", log)
	}
}
