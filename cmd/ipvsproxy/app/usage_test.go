package app

import (
	"bytes"
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
