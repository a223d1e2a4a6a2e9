//go:build e2e

// Package e2e holds the end-to-end tests: they run as root inside the
// user-mode-Linux sandbox (see run.sh) against a real kube-apiserver, a
// real IPVS kernel and real traffic. Objects are created through the API
// server; the kernel is checked with ipvsadm, ip and ipset.
package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/e2e/framework"
)

var (
	cluster *framework.Cluster
	results string // the results folder on the host, for logs

	proxyOnce sync.Once
	theProxy  *framework.Proxy
	proxyErr  error
)

func TestMain(m *testing.M) {
	if err := setup(); err != nil {
		// A sandbox without its API server cannot test anything: fail loudly.
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	code := m.Run()
	if theProxy != nil {
		if !theProxy.Running() {
			fmt.Fprintf(os.Stderr, "e2e: ipvsproxy had exited (%v) by the end of the suite; log %s\n", theProxy.ExitErr(), theProxy.LogPath)
			code = 1
		}
		if err := theProxy.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		}
	}
	_ = os.WriteFile(filepath.Join(results, "kernel-at-exit.txt"), []byte(framework.DumpKernel()), 0o644)
	os.Exit(code)
}

func setup() error {
	var err error
	if results, err = framework.Env("E2E_RESULTS"); err != nil {
		return err
	}
	kubeconfig, err := framework.Env("E2E_KUBECONFIG")
	if err != nil {
		return err
	}
	node, err := framework.Env("E2E_NODE")
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("must run as root inside the sandbox")
	}
	cluster, err = framework.NewCluster(kubeconfig, node)
	return err
}

// proxy returns the running ipvsproxy, starting it on first use; tests
// that check the sandbox itself never call it, so they run (and tell the
// harness works) even while the product does not build.
func proxy(t *testing.T) *framework.Proxy {
	t.Helper()
	proxyOnce.Do(func() {
		path, err := framework.Env("E2E_IPVSPROXY")
		if err != nil {
			proxyErr = err
			return
		}
		if _, err := os.Stat(path); err != nil {
			proxyErr = fmt.Errorf("ipvsproxy binary: %w", err)
			return
		}
		theProxy = framework.NewProxy(path, cluster.Kubeconfig, cluster.Node, filepath.Join(results, "ipvsproxy.log"))
		proxyErr = theProxy.Start()
	})
	if proxyErr != nil {
		t.Fatalf("ipvsproxy: %v", proxyErr)
	}
	if !theProxy.Running() {
		// Only tests stop it, and they start it again: this is a crash,
		// found late. Fail here, restart so later tests still run.
		t.Errorf("ipvsproxy had exited (%v) since the previous test; restarting it (log %s)", theProxy.ExitErr(), theProxy.LogPath)
		if err := theProxy.Start(); err != nil {
			t.Fatalf("ipvsproxy did not restart: %v", err)
		}
	}
	return theProxy
}
