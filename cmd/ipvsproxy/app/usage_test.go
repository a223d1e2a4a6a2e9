package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runMain runs the command line as the binary does, returning its exit
// code and what it wrote on stderr.
func runMain(args ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	code := Main(args, &stdout, &stderr)
	return code, stderr.String()
}

// TestBadInvocationsExit2: a command line that cannot be understood
// (a misspelt command, arguments nobody takes, an unknown flag) says so in
// one line on stderr and exits 2 — never 1, which diff uses for
// "different", and never silently.
func TestBadInvocationsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"clenaup"}, `unknown command "clenaup" for "ipvsproxy" (did you mean "cleanup"?)`},
		{[]string{"x"}, `unknown command "x" for "ipvsproxy"`},
		{[]string{"cleanup", "now"}, `cleanup takes no arguments, got "now"`},
		{[]string{"version", "x"}, `version takes no arguments, got "x"`},
		{[]string{"diff", "x"}, `diff takes no arguments, got "x"`},
		{[]string{"status", "a", "b"}, `status takes no arguments, got "a b"`},
		{[]string{"prepare-node", "x"}, `prepare-node takes no arguments, got "x"`},
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"cleanup", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"version", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"--ipvs-sync-period", "soon"}, `invalid argument "soon" for "--ipvs-sync-period"`},
	} {
		code, stderr := runMain(c.args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", c.args, code, stderr)
		}
		if !strings.HasPrefix(stderr, "ipvsproxy: ") || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: stderr %q, want one line 'ipvsproxy: ...%s...'", c.args, stderr, c.want)
		}
	}
}

// A bad value is not a usage error: one line, exit 1, as kube-proxy.
func TestBadValueExit1(t *testing.T) {
	code, stderr := runMain("--ipvs-scheduler", "fastest")
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `--ipvs-scheduler "fastest"`) {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// --write-config-to writes the configuration and exits, as in kube-proxy,
// which would silently skip the cleanup --cleanup asked for: refused,
// before either happens.
func TestCleanupWithWriteConfigToRefused(t *testing.T) {
	out := filepath.Join(t.TempDir(), "config.yaml")
	code, stderr := runMain("--cleanup", "--write-config-to", out)
	if code != 2 || strings.Count(stderr, "\n") != 1 ||
		!strings.Contains(stderr, "--cleanup and --write-config-to cannot be used together") {
		t.Errorf("exit %d, stderr %q; want 2 and one line refusing the combination", code, stderr)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("%s written (%v) although the command was refused", out, err)
	}
}

// TestToolHelp: each subcommand's help has an example, says what
// privileges it needs, and lists only the proxy flags it reads, while
// still accepting the others (the DaemonSet's command line is passed as
// it is).
func TestToolHelp(t *testing.T) {
	for _, c := range []struct{ tool, shown, hidden, needs string }{
		{"diff", "--kubeconfig", "--conntrack-min", "CAP_NET_ADMIN"},
		{"status", "--metrics-bind-address", "--kube-api-qps", "CAP_NET_ADMIN"},
		{"cleanup", "--ipvs-exclude-cidrs", "--kube-api-burst", "root"},
		{"prepare-node", "--conntrack-min", "--kubeconfig", "/proc/sys"},
		{"doctor", "--ipvs-scheduler", "--kubeconfig", "CAP_NET_ADMIN"},
	} {
		var out bytes.Buffer
		cmd := NewCommand()
		cmd.SetOut(&out)
		cmd.SetArgs([]string{c.tool, "--help"})
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		help := out.String()
		if !strings.Contains(help, "Examples:\n  ipvsproxy "+c.tool) || !strings.Contains(help, c.needs) {
			t.Errorf("%s --help has no example or does not say it needs %s:\n%s", c.tool, c.needs, help)
		}
		if !strings.Contains(help, c.shown+" ") || strings.Contains(help, c.hidden+" ") {
			t.Errorf("%s --help: want %s listed and %s not:\n%s", c.tool, c.shown, c.hidden, help)
		}
		if code, stderr := runMain(c.tool, c.hidden+"=1", "--no-such-flag"); !strings.Contains(stderr, "unknown flag: --no-such-flag") || code != 2 {
			t.Errorf("%s %s=1: not accepted as a hidden flag (exit %d, %q)", c.tool, c.hidden, code, stderr)
		}
	}
}

// TestCleanupFlagHelp: the --cleanup bool reads as a bool in the help
// (pflag takes a back-quoted word in the usage as the value's name).
func TestCleanupFlagHelp(t *testing.T) {
	var out bytes.Buffer
	cmd := NewCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--cleanup  ") || strings.Contains(out.String(), "--cleanup ipvsproxy") {
		t.Errorf("--cleanup help line: %q", out.String())
	}
}
