package sync

import (
	"bytes"
	"os"
	"strings"
	gosync "sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// logBuffer collects klog's output for a test.
type logBuffer struct {
	mu  gosync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// line is the first logged line holding s ("" when none).
func (b *logBuffer) line(s string) string {
	klog.Flush()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range strings.Split(b.buf.String(), "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

func captureLogs(t *testing.T) *logBuffer {
	b := &logBuffer{}
	klog.LogToStderr(false)
	klog.SetOutput(b)
	t.Cleanup(func() {
		klog.Flush()
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return b
}

// The start-up's milestones are logged: when programming can begin (with
// how long the node-wide objects and the kernel's read took), and the
// two that name the process's CPU so far, which splits a node's start-up
// cost into receiving the cluster and programming it (bench100k reads
// them).
func TestStartupLinesNameTheProcessCPU(t *testing.T) {
	logs := captureLogs(t)
	var calls gosync.Mutex
	cpu := 1500 * time.Millisecond
	h := newStartHarness(t, DefaultCriticalServices, func(c *RunnerConfig) {
		c.ProcessCPU = func() time.Duration {
			calls.Lock()
			defer calls.Unlock()
			cpu += 250 * time.Millisecond
			return cpu
		}
	})
	h.deliver(t, criticalObjects()...)
	h.run(t)
	h.synced.Store(true)
	eventually(t, "the first full pass done", h.runner.Ready)
	if l := logs.line(`"Node-wide objects in place and the kernel read; programming services as they arrive"`); !strings.Contains(l, "prepare=") || !strings.Contains(l, "read=") {
		t.Errorf("no line saying when programming could begin, with how long preparing and reading took: %q", l)
	}
	listed := logs.line(`"Informers have delivered their initial lists"`)
	ready := logs.line(`"Ready: the first full pass has programmed every service"`)
	if !strings.Contains(listed, `cpu="1.75s"`) || !strings.Contains(ready, `cpu="2s"`) {
		t.Errorf("start-up lines without the process's CPU in turn:\n%s\n%s", listed, ready)
	}
}

// Without ProcessCPU the lines say nothing of it.
func TestStartupLinesWithoutProcessCPU(t *testing.T) {
	logs := captureLogs(t)
	h := newStartHarness(t, DefaultCriticalServices, nil)
	h.deliver(t, criticalObjects()...)
	h.run(t)
	h.synced.Store(true)
	eventually(t, "the first full pass done", h.runner.Ready)
	if l := logs.line(`"Ready: the first full pass`); l == "" || strings.Contains(l, "cpu=") {
		t.Errorf("Ready line %q: want one, without cpu", l)
	}
}
