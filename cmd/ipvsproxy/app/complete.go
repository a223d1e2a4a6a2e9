package app

import (
	"github.com/spf13/pflag"
)

// Complete makes the options final, once, before anything reads them:
// it reads --config into o (flags given on the command line win),
// applies kube-proxy's compatibility flags, validates, and parses what
// the later steps use. Warnings (ignored flags and fields, a leniently
// decoded file) are kept for Warnings, as logging is set up only after
// the file has been read.
func (o *Options) Complete(fs *pflag.FlagSet) error {
	cf, err := o.loadConfig(fs)
	if err != nil {
		return err
	}
	warnings, err := o.compat.complete(o, fs)
	if err != nil {
		return err
	}
	if o.parsed, err = o.parse(); err != nil {
		return cf.Explain(err)
	}
	if cf != nil {
		warnings = append(warnings, cf.Warnings()...)
	}
	o.config = cf
	o.warnings = warnings
	return nil
}

// Warnings returns what Complete found worth a warning, one line each.
func (o *Options) Warnings() []string { return o.warnings }
