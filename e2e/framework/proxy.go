//go:build e2e

package framework

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Proxy runs the ipvsproxy binary under test. Every start appends to the
// same log file in the results folder, with a marker line, so a restart
// test's log reads as one story.
type Proxy struct {
	Path    string
	Args    []string
	LogPath string
	Healthz string // URL polled to know the process is serving

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// SyncPeriod is the --ipvs-sync-period the sandbox runs ipvsproxy with:
// drift must be repaired within it.
const SyncPeriod = 10 * time.Second

// IPTablesBackend is the iptables backend under test (E2E_IPTABLES, which
// e2e/sandbox/uml-run sets from E2E_KERNEL): the proxy is started with it,
// and plain `iptables`/`iptables-save` on the guest's PATH are its tools
// (e2e/guest/cluster.sh), so a test reads what the proxy wrote.
func IPTablesBackend() string {
	if b := os.Getenv("E2E_IPTABLES"); b != "" {
		return b
	}
	panic("E2E_IPTABLES is not set: run the suite with e2e/run.sh (e2e/sandbox/uml-run sets it)")
}

// NewProxy builds the command line of the CLI contract for this sandbox.
func NewProxy(path, kubeconfig, node, logPath string) *Proxy {
	return &Proxy{
		Path: path,
		Args: []string{
			"--kubeconfig", kubeconfig,
			"--hostname-override", node,
			"--cluster-cidr", "10.244.0.0/16",
			"--ipvs-sync-period", SyncPeriod.String(),
			"--ipvs-min-sync-period", "0s",
			"--iptables-backend", IPTablesBackend(),
			"--rules-backend", RulesBackend(),
			"--healthz-bind-address", "127.0.0.1:10256",
			"--metrics-bind-address", "127.0.0.1:10249",
			"-v", "2",
		},
		LogPath: logPath,
		Healthz: "http://127.0.0.1:10256/healthz",
	}
}

// Start launches the process and waits until its health endpoint answers
// (any status: a fresh proxy may report unhealthy until its first sync).
// It fails if the process exits; if the endpoint never answers the
// process is still left running and the error says so.
func (p *Proxy) Start() error {
	if p.Running() {
		return fmt.Errorf("ipvsproxy already running (pid %d)", p.cmd.Process.Pid)
	}
	log, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "\n===== e2e: starting %s at %s\n", p.Path, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start ipvsproxy: %w", err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return Eventually(30*time.Second, 100*time.Millisecond, func() error {
		select {
		case <-p.done:
			return Permanent(fmt.Errorf("ipvsproxy exited: %v (log %s)", p.err, p.LogPath))
		default:
		}
		resp, err := http.Get(p.Healthz)
		if err != nil {
			return fmt.Errorf("healthz not answering: %w", err)
		}
		resp.Body.Close()
		return nil
	})
}

// Running reports whether the process is alive.
func (p *Proxy) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitErr is how the last process ended (nil while running).
func (p *Proxy) ExitErr() error {
	if p.Running() || p.cmd == nil {
		return nil
	}
	if p.err == nil {
		return fmt.Errorf("exit status 0")
	}
	return p.err
}

// Stop sends SIGTERM and waits up to 30 s, then SIGKILL.
func (p *Proxy) Stop() error { return p.signal(syscall.SIGTERM, 30*time.Second) }

// Kill sends SIGKILL: the crash case, nothing gets to clean up.
func (p *Proxy) Kill() error { return p.signal(syscall.SIGKILL, 10*time.Second) }

func (p *Proxy) signal(sig syscall.Signal, grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("ipvsproxy ignored %v for %v; killed", sig, grace)
	}
}

// Restart stops the process gracefully and starts it again.
func (p *Proxy) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.Start()
}
