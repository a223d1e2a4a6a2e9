package app

import (
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ipvsproxy/ipvsproxy/sync"
)

// The start-up settings kube-proxy has no flag for: which services a
// starting node programs first, and the taint it removes once ready
// (docs/architecture.md, "Start-up order and readiness").

// addStartFlags registers them.
func (o *Options) addStartFlags(fs *pflag.FlagSet) {
	fs.StringSliceVar(&o.CriticalServices, "critical-services", o.CriticalServices, "Services programmed before all others while the proxy starts, comma-separated: NAMESPACE/NAME, or LABEL=VALUE for the Services with that label in any namespace. "+sync.KubernetesService+" always is; empty: only it.")
	fs.StringVar(&o.RemoveStartupTaint, "remove-startup-taint", o.RemoveStartupTaint, "A taint key (for example one kubelet registers the node with) that ipvsproxy removes from its own Node, whatever the effect, once its first full pass has programmed every service (/readyz answers 200); empty (the default) removes none. Needs patch on nodes (deploy/startup-taint).")
}

// criticalServices parses --critical-services.
func (o *Options) criticalServices() (sync.CriticalServices, error) {
	c, err := sync.ParseCriticalServices(o.CriticalServices)
	if err != nil {
		return c, fmt.Errorf("--critical-services %w", err)
	}
	return c, nil
}

func (o *Options) validateStartupTaint() error {
	if o.RemoveStartupTaint == "" {
		return nil
	}
	if errs := validation.IsQualifiedName(o.RemoveStartupTaint); len(errs) > 0 {
		return fmt.Errorf("--remove-startup-taint %q: not a taint key: %s", o.RemoveStartupTaint, errs[0])
	}
	return nil
}
