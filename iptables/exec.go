package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runFunc runs one binary with stdin and returns stdout and stderr.
type runFunc func(ctx context.Context, bin string, args []string, stdin []byte) (stdout, stderr []byte, err error)

func execRun(ctx context.Context, bin string, args []string, stdin []byte) ([]byte, []byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	return out.Bytes(), errb.Bytes(), err
}

// ExecRunner implements SaveRestorer with the iptables-save/-restore binaries
// of one family and backend (iptables-legacy-save, ip6tables-nft-restore,
// ...), called by their explicit backend names so that the host's
// alternatives setting does not matter.
type ExecRunner struct {
	family  Family
	backend Backend
	// Timeout bounds each process (default 30 s): a wedged iptables must
	// not hang the sync loop forever.
	Timeout time.Duration
	run     runFunc

	once    sync.Once
	version [3]int // of iptables-restore; zero if unknown
}

var _ SaveRestorer = (*ExecRunner)(nil)

// NewExecRunner returns a runner for family and backend. BackendAuto is
// resolved here with DetectBackend.
func NewExecRunner(family Family, backend Backend) (*ExecRunner, error) {
	if family != IPv4 && family != IPv6 {
		return nil, fmt.Errorf("iptables: invalid family %d", family)
	}
	if backend == "" || backend == BackendAuto {
		b, err := DetectBackend()
		if err != nil {
			return nil, err
		}
		backend = b
	}
	if backend != BackendLegacy && backend != BackendNFT {
		return nil, fmt.Errorf("iptables: unknown backend %q", backend)
	}
	return &ExecRunner{family: family, backend: backend, Timeout: 30 * time.Second, run: execRun}, nil
}

// Family implements SaveRestorer.
func (r *ExecRunner) Family() Family { return r.family }

// Backend returns the resolved backend.
func (r *ExecRunner) Backend() Backend { return r.backend }

func binary(family Family, backend Backend, tool string) string {
	prefix := "iptables"
	if family == IPv6 {
		prefix = "ip6tables"
	}
	return prefix + "-" + string(backend) + "-" + tool
}

// Save implements SaveRestorer: `<x>tables-<backend>-save -t table`.
func (r *ExecRunner) Save(table string) ([]byte, error) {
	if _, ok := builtinChains[table]; !ok {
		return nil, fmt.Errorf("iptables: unknown table %q", table)
	}
	return r.call(binary(r.family, r.backend, "save"), []string{"-t", table}, nil)
}

// Restore implements SaveRestorer: `<x>tables-<backend>-restore [-w 5] --noflush
// --counters` with data on stdin. The 5 s lock wait (iptables >= 1.6.2)
// rides out other writers holding the xtables lock instead of failing;
// it is bounded so a stuck holder shows up as an error, not a hang.
func (r *ExecRunner) Restore(data []byte) error {
	args := []string{"--noflush", "--counters"}
	if r.atLeast(1, 6, 2) {
		args = append([]string{"-w", "5"}, args...)
	}
	_, err := r.call(binary(r.family, r.backend, "restore"), args, data)
	return err
}

// HasRandomFully reports whether MASQUERADE --random-fully can be
// written; kube-proxy uses the same iptables version threshold.
func (r *ExecRunner) HasRandomFully() bool { return r.atLeast(1, 6, 2) }

// atLeast compares the iptables version, probed once.
func (r *ExecRunner) atLeast(major, minor, patch int) bool {
	r.once.Do(func() {
		out, err := r.call(binary(r.family, r.backend, "restore"), []string{"--version"}, nil)
		if err == nil {
			r.version = parseVersion(string(out))
		}
	})
	v := r.version
	return v[0] > major || v[0] == major && (v[1] > minor || v[1] == minor && v[2] >= patch)
}

var versionRE = regexp.MustCompile(`v(\d+)\.(\d+)\.(\d+)`)

// parseVersion reads "iptables-restore v1.8.9 (legacy)".
func parseVersion(s string) [3]int {
	var v [3]int
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return v
	}
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	return v
}

func (r *ExecRunner) call(bin string, args []string, stdin []byte) ([]byte, error) {
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	run := r.run
	if run == nil {
		run = execRun
	}
	out, stderr, err := run(ctx, bin, args, stdin)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), timeout)
		}
		return nil, commandError(bin, args, err, stderr)
	}
	return out, nil
}

// commandError makes one line: the command, how it failed, and its
// stderr with the line breaks and the "Try `iptables-restore -h'" hint
// squeezed out, so a log line or Event shows the kernel's reason.
func commandError(bin string, args []string, err error, stderr []byte) error {
	var parts []string
	for _, l := range strings.Split(string(stderr), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "Try `") {
			parts = append(parts, l)
		}
	}
	msg := fmt.Sprintf("%s %s: %v", bin, strings.Join(args, " "), err)
	if len(parts) > 0 {
		msg += ": " + strings.Join(parts, "; ")
	}
	return errors.New(msg)
}
