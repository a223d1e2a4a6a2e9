package app

// Logging goes through k8s.io/component-base/logs, as kube-proxy's does:
// the same flags (-v, --vmodule, --logging-format=text|json,
// --log-flush-frequency, --log-text-*/--log-json-*) and the same config
// file section, so a DaemonSet's logging flags and a log pipeline that
// parses kube-proxy's JSON keep working.

import (
	"sync"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
)

// loggingGates holds only the logging feature gates (their alpha/beta
// options and contextual logging), at their defaults: --feature-gates
// has no effect here (see compatflags.go).
var loggingGates = func() featuregate.MutableFeatureGate {
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		panic(err) // only on a duplicate gate name: a programming error
	}
	return fg
}()

// addLoggingFlags registers kube-proxy's logging flags on fs, bound to c.
func addLoggingFlags(c *logsapi.LoggingConfiguration, fs *pflag.FlagSet) {
	logsapi.AddFlags(c, fs)
	logs.AddFlags(fs) // what component-base's cli.Run adds; idempotent
}

// applyLogging makes c the process's logging configuration. The second
// and later calls with the same configuration (tests running several
// commands in one process) are accepted; a different one is an error.
func applyLogging(c *logsapi.LoggingConfiguration) error {
	initLogs.Do(func() {
		logs.InitLogs() // Go's log package through klog, as kube-proxy
		logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	})
	return logsapi.ValidateAndApply(c, loggingGates)
}

var initLogs sync.Once

// mergeLogging returns the file's logging section with the logging flags
// given on the command line applied on top, as kube-proxy's
// copyLogsFromFlags does (a --vmodule from the flags comes first).
func mergeLogging(file logsapi.LoggingConfiguration, fs *pflag.FlagSet) (*logsapi.LoggingConfiguration, error) {
	c := file.DeepCopy()
	logsapi.SetRecommendedLoggingConfiguration(c)
	var clone pflag.FlagSet
	logsapi.AddFlags(c, &clone)
	vmodule := c.VModule
	c.VModule = nil
	var err error
	clone.VisitAll(func(f *pflag.Flag) {
		if from := fs.Lookup(f.Name); err == nil && from != nil && from.Changed {
			err = f.Value.Set(from.Value.String())
		}
	})
	c.VModule = append(c.VModule, vmodule...)
	return c, err
}
