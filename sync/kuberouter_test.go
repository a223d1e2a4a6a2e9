package sync

import (
	"reflect"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// TestKubeRouterAnnotations: a Service annotated for kube-router keeps its
// scheduler and flags on ipvsproxy; ipvsproxy's own annotations win when
// both are set; a bad kube-router value is reported under its own name.
func TestKubeRouterAnnotations(t *testing.T) {
	for _, c := range []struct {
		name        string
		annotations map[string]string
		sched       string
		flags       ipvs.Flags
		problems    []string
	}{
		{"kube-router's scheduler", map[string]string{AnnotationKubeRouterScheduler: "lc"}, "lc", 0, nil},
		{"kube-router's flags", map[string]string{AnnotationKubeRouterScheduler: "sh", AnnotationKubeRouterSchedFlags: "flag-1,flag-2"},
			"sh", ipvs.FlagSchedFlag1 | ipvs.FlagSchedFlag2, nil},
		{"ours win", map[string]string{AnnotationKubeRouterScheduler: "lc", AnnotationScheduler: "wlc"}, "wlc", 0, nil},
		{"flag-3 does not apply", map[string]string{AnnotationKubeRouterScheduler: "mh", AnnotationKubeRouterSchedFlags: "flag-3"}, "mh", 0,
			[]string{`annotation kube-router.io/service.schedflags: flag "flag-3" does not apply to scheduler "mh"; ignored`}},
		{"unknown scheduler", map[string]string{AnnotationKubeRouterScheduler: "fastest"}, "rr", 0,
			[]string{`annotation kube-router.io/service.scheduler: unknown scheduler "fastest"; using "rr"`}},
	} {
		s := svc("default", "web", "10.96.0.10", "80")
		s.Annotations = c.annotations
		stripService(s) // the informer's transform must keep them
		sched, flags, problems := schedulerFor(s, "rr", nil)
		if sched != c.sched || flags != c.flags || !reflect.DeepEqual(problems, c.problems) {
			t.Errorf("%s: got %s %v %q, want %s %v %q", c.name, sched, flags, problems, c.sched, c.flags, c.problems)
		}
	}
}
