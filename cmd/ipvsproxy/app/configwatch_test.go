package app

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestConfigFileChangeEndsTheProxy: editing the --config file (a
// ConfigMap update) makes the proxy exit, as kube-proxy does, so that its
// restart reads the new file; an unchanged file does not.
func TestConfigFileChangeEndsTheProxy(t *testing.T) {
	path := writeFile(t, kpHeader)
	data, _ := os.ReadFile(path)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go watchConfigFile(ctx, path, data, 5*time.Millisecond, cancel)

	time.Sleep(50 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatalf("stopped with the file unchanged: %v", context.Cause(ctx))
	}
	if err := os.WriteFile(path, []byte(kpHeader+"ipvs:\n  scheduler: lc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("still running 5 s after the file changed")
	}
	var changed *errConfigChanged
	if err := context.Cause(ctx); !errors.As(err, &changed) || !strings.Contains(err.Error(), "config file "+path+" changed") {
		t.Errorf("cause %v", err)
	}
}
