package ipvs

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SchedulerAvailable checks, without touching IPVS, that the kernel can
// use the named scheduler ("rr", "sh", ...), so a bad --ipvs-scheduler is
// reported once at start-up instead of as a failure on every service.
//
// A scheduler is available when its module ip_vs_<name> is loaded (or
// built in: /sys/module/ip_vs_<name>), or when the module is installed
// (modules.dep or modules.builtin under /lib/modules/<release>), because
// the kernel loads scheduler modules on demand when a service asks for
// one. The check reads files only; it loads nothing.
func SchedulerAvailable(name string) error {
	if name == "" || strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	}) >= 0 {
		return fmt.Errorf("invalid IPVS scheduler name %q", name)
	}
	mod := "ip_vs_" + name
	if _, err := os.Stat(filepath.Join("/sys/module", mod)); err == nil {
		return nil
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		dir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
		for _, f := range []string{"modules.dep", "modules.builtin"} {
			if listsModule(filepath.Join(dir, f), mod) {
				return nil
			}
		}
	}
	return fmt.Errorf("IPVS scheduler %q is not available in this kernel: load the %s module (modprobe %s)", name, mod, mod)
}

// listsModule reports whether a modules.dep/modules.builtin file names
// mod. Lines look like "kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz: ...".
func listsModule(path, mod string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		file, _, _ := strings.Cut(s.Text(), ":")
		base := filepath.Base(file)
		// Strip ".ko", or a compression suffix and then ".ko".
		m := strings.TrimSuffix(base, filepath.Ext(base))
		if m == mod || strings.TrimSuffix(m, ".ko") == mod {
			return true
		}
	}
	return false
}

// SchedulerLoaded reports whether the named scheduler's module is loaded
// (or built in) now. Unlike SchedulerAvailable it does not count an
// installed module: this answers "has someone loaded the module the kernel
// refused to load on demand?".
func SchedulerLoaded(name string) bool {
	if name == "" || strings.ContainsAny(name, "/.") {
		return false
	}
	_, err := os.Stat(filepath.Join("/sys/module", "ip_vs_"+name))
	return err == nil
}
