package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// errConfigChanged ends the proxy when its --config file changes. As
// kube-proxy does, it exits (status 1) rather than reconfigure itself:
// the kubelet restarts the container, and the new process reads the new
// file from the start, so a ConfigMap edit reaches every node with no
// half-applied state. The kernel stays as it is across the restart.
type errConfigChanged struct {
	path string
	err  error // the read error, when the file could not be read
}

func (e *errConfigChanged) Error() string {
	if e.err != nil {
		return fmt.Sprintf("config file %s can no longer be read (%v); exiting so that the restarted proxy reads it again", e.path, e.err)
	}
	return fmt.Sprintf("config file %s changed; exiting so that the restarted proxy reads the new configuration", e.path)
}

// watchConfigFile compares the file with what was read at start every
// interval, until ctx ends, and calls changed once when it differs.
// Polling, not inotify: a ConfigMap volume replaces the file by swapping
// a symlink of its parent directory, which a watch on the file misses,
// and one small read every few seconds costs nothing.
func watchConfigFile(ctx context.Context, path string, read []byte, interval time.Duration, changed func(error)) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	wait.UntilWithContext(ctx, func(context.Context) {
		now, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(now, read) {
			changed(&errConfigChanged{path: path, err: err})
			stop()
		}
	}, interval)
}
