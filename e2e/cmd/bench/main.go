//go:build e2e

// Command bench is the kernel benchmark of ipvsproxy (with either rules
// backend: iptables, nftables) against kube-proxy's IPVS and nftables
// modes. It runs inside the user-mode-Linux sandbox, after
// e2e/guest/cluster.sh has started etcd and kube-apiserver (e2e/bench.sh
// does all of it):
//
//	bench --n "1000 5000" --ipvsproxy bin/ipvsproxy --ipvsproxy-backends "iptables nftables" \
//		--kube-proxy PATH --kube-proxy-modes "ipvs nftables"
//
// For each N (ascending; the cluster grows between sizes) it creates the
// Services and EndpointSlices through the API server with parallel
// clients, then runs each proxy alone on a cleaned node: time from start
// to the kernel holding every service with its backends and the sets or
// maps that admit its traffic; then single-endpoint changes, each timed
// from the API write to the kernel showing it; services added and
// deleted; CPU seconds and peak RSS of the proxy; last a restart on the
// programmed node, timed until a change written at the restart shows. It
// prints a table per N with ratios.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type config struct {
	sizes             []int
	changes           int
	lifecycles        int
	workers           int
	ipvsproxy         string
	ipvsproxyBackends []string
	kubeProxy         string
	kubeProxyModes    []string
	kubeconfig        string
	node, nodeIP      string
	results           string
	seed              uint64
	gap               time.Duration
	interval          time.Duration
	programTimeout    time.Duration
	changeTimeout     time.Duration
}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	// Exits on a bad flag, as the global flag set did (the tests pass good ones).
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	var sizes string
	fs.StringVar(&sizes, "n", "1000", "service counts to measure, ascending, space or comma separated")
	fs.IntVar(&c.changes, "changes", 100, "single-endpoint changes per proxy and size")
	fs.IntVar(&c.workers, "workers", 16, "parallel API clients creating the services")
	fs.StringVar(&c.ipvsproxy, "ipvsproxy", "", "ipvsproxy binary (empty: skip)")
	var backends string
	fs.StringVar(&backends, "ipvsproxy-backends", "iptables", "ipvsproxy's --rules-backend values to measure, in order: iptables (ipvsproxy), nftables (ipvsproxy-nftables) (space or comma separated)")
	fs.StringVar(&c.kubeProxy, "kube-proxy", "", "kube-proxy binary (empty: skip)")
	var modes string
	fs.StringVar(&modes, "kube-proxy-modes", "ipvs", "kube-proxy's modes to measure, in order: ipvs (kube-proxy), nftables (kube-proxy-nftables) (space or comma separated)")
	fs.IntVar(&c.lifecycles, "service-changes", 5, "services added and then deleted, one at a time, per proxy and size")
	fs.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("E2E_KUBECONFIG"), "kubeconfig of the sandbox API server")
	fs.StringVar(&c.node, "node", os.Getenv("E2E_NODE"), "the sandbox Node's name")
	fs.StringVar(&c.nodeIP, "node-ip", "10.10.0.1", "the sandbox Node's address (NodePort virtual servers)")
	fs.StringVar(&c.results, "results", os.Getenv("E2E_RESULTS"), "folder for logs and results")
	fs.Uint64Var(&c.seed, "seed", 7, "seed of the sequence of changed services (the same for both proxies)")
	fs.DurationVar(&c.interval, "interval", 500*time.Millisecond, "write a change every interval, seen or not (open loop); 0: serial, each after the previous one showed")
	fs.DurationVar(&c.gap, "gap", 200*time.Millisecond, "with --interval 0, pause between a change showing and the next write")
	fs.DurationVar(&c.programTimeout, "program-timeout", 30*time.Minute, "give up waiting for the initial programming after this long")
	fs.DurationVar(&c.changeTimeout, "change-timeout", 5*time.Minute, "give up waiting for one change after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if c.ipvsproxyBackends, err = parseModes("ipvsproxy-backends", backends, ipvsproxyVariants); err != nil {
		return nil, err
	}
	if c.kubeProxyModes, err = parseModes("kube-proxy-modes", modes, kubeProxyVariants); err != nil {
		return nil, err
	}
	for _, f := range strings.FieldsFunc(sizes, func(r rune) bool { return r == ' ' || r == ',' }) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("--n: bad size %q", f)
		}
		if len(c.sizes) > 0 && n < c.sizes[len(c.sizes)-1] {
			return nil, fmt.Errorf("--n: sizes must ascend (the cluster only grows)")
		}
		c.sizes = append(c.sizes, n)
	}
	if len(c.sizes) == 0 || c.kubeconfig == "" || c.node == "" || c.results == "" {
		return nil, fmt.Errorf("need --n, --kubeconfig, --node and --results (or E2E_KUBECONFIG, E2E_NODE, E2E_RESULTS)")
	}
	return c, nil
}

func main() {
	c, err := parseFlags(os.Args[1:])
	if err == nil {
		err = run(context.Background(), c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var t0 = time.Now()

func logf(format string, args ...any) {
	fmt.Printf("[bench %6.1fs] %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, args...))
}

// prepareRoutes routes the endpoint range to a dummy link: real servers
// need a route, and with no address on the link no endpoint address is
// local or a subnet broadcast (which the kernel refuses as a real server).
func prepareRoutes() error {
	for _, args := range [][]string{
		{"link", "add", "bench0", "type", "dummy"},
		{"link", "set", "bench0", "up"},
		{"route", "add", "10.128.0.0/12", "dev", "bench0"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func run(ctx context.Context, c *config) error {
	if err := prepareRoutes(); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit: measure the API server
	// Protobuf, as controllers use: less of the API server's (single, shared) CPU per write.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	w := &workload{cs: cs}
	all := specs(c)
	if len(all) == 0 {
		return fmt.Errorf("no proxy to measure (--ipvsproxy, --kube-proxy)")
	}
	table := filepath.Join(c.results, "bench-table.md")
	failed := false
	for _, n := range c.sizes {
		from := len(w.svcs)
		took, err := w.grow(ctx, n, c.workers)
		if err != nil {
			return fmt.Errorf("creating services %d..%d: %w", from, n-1, err)
		}
		rate := float64(n-from) / took.Seconds()
		logf("created services %d..%d in %.1fs: %.1f services/s (%.1f objects/s) with %d clients",
			from, n-1, took.Seconds(), rate, 2*rate, c.workers)
		var res []*result
		for _, p := range all {
			r := measureProxy(ctx, c, w, p, all)
			if r.err != "" {
				failed = true
				logf("%s at N=%d: %s", p.name, n, r.err)
			}
			res = append(res, r)
			if err := r.save(c.results); err != nil {
				return err
			}
		}
		md := renderTable(n, w, rate, c.workers, res)
		fmt.Print("\n" + md + "\n")
		if err := appendFile(table, md+"\n"); err != nil {
			return err
		}
	}
	logf("tables in %s", table)
	if failed {
		return fmt.Errorf("some measurements failed (see above and the proxies' logs in %s)", c.results)
	}
	return nil
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
