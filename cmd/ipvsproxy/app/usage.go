package app

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// Main runs the command line and returns the process exit code: 0, 1 for
// a failure (diff: "different"), 2 for a command line that cannot be
// understood (and for any diff error). Every failure has printed one line
// on stderr by then.
func Main(args []string, stdout, stderr io.Writer) int {
	cmd := NewCommand()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	err := cmd.Execute()
	var r *reportedError
	var e *exitError
	if err != nil && !errors.As(err, &r) && !(errors.As(err, &e) && e.err == nil) {
		// An error cobra returned before any of our code ran (the
		// commands silence cobra's own printing, which would add the
		// whole usage text): never exit without saying why.
		fmt.Fprintf(stderr, "ipvsproxy: %v\n", err)
	}
	return ExitCode(err)
}

// reportedError is an error already printed on stderr.
type reportedError struct{ err error }

func (e *reportedError) Error() string { return e.err.Error() }
func (e *reportedError) Unwrap() error { return e.err }

// usageError prints err as a usage error and makes the process exit 2,
// as most command-line tools do: 1 is diff's "different", and a script
// must be able to tell a typo from a result.
func usageError(c *cobra.Command, err error) error {
	return &exitError{2, fail(c, fmt.Errorf("%v (see %s --help)", err, c.CommandPath()))}
}

// noArgs is cobra.NoArgs with a usage error: cobra's own error would be
// printed nowhere (the commands silence cobra) and exit 1. On the root
// command an argument is a misspelt subcommand.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if c.HasSubCommands() {
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2 // cobra's default, set only on its own path
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += fmt.Sprintf(" (did you mean %q?)", s[0])
		}
		return usageError(c, errors.New(msg))
	}
	return usageError(c, fmt.Errorf("%s takes no arguments, got %q", c.Name(), strings.Join(args, " ")))
}
