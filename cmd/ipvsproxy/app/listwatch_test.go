package app

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// scriptedLW fails its first calls with the given errors, then succeeds.
type scriptedLW struct {
	errs  []error
	calls int
}

func (s *scriptedLW) next() error {
	s.calls++
	if len(s.errs) > 0 {
		e := s.errs[0]
		s.errs = s.errs[1:]
		return e
	}
	return nil
}

func (s *scriptedLW) ListWithContext(context.Context, metav1.ListOptions) (runtime.Object, error) {
	if err := s.next(); err != nil {
		return nil, err
	}
	return &v1.ServiceList{}, nil
}

func (s *scriptedLW) WatchWithContext(context.Context, metav1.ListOptions) (watch.Interface, error) {
	if err := s.next(); err != nil {
		return nil, err
	}
	return watch.NewFake(), nil
}

var _ cache.ListerWatcherWithContext = (*scriptedLW)(nil)

func refused() error {
	return fmt.Errorf("dial tcp 127.0.0.1:6443: connect: %w", syscall.ECONNREFUSED)
}

func TestPromptListWatchRetriesAnUnavailableAPIServerBriefly(t *testing.T) {
	lw := &scriptedLW{errs: []error{refused(), refused(), refused(), refused(), refused(),
		apierrors.NewServiceUnavailable("etcd is down")}}
	var slept []time.Duration
	p := newPromptListWatch("services", lw)
	p.sleep = func(_ context.Context, d time.Duration) bool { slept = append(slept, d); return true }
	if _, err := p.WatchWithContext(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("watch after the API server came back: %v", err)
	}
	if lw.calls != 7 || len(slept) != 6 {
		t.Fatalf("calls %d, sleeps %v", lw.calls, slept)
	}
	for i, d := range slept {
		if d > 5*time.Second || d < 500*time.Millisecond {
			t.Errorf("sleep %d = %v: want between 0.5 s and the 5 s cap", i, d)
		}
	}
}

func TestPromptListWatchPassesOtherErrorsThrough(t *testing.T) {
	gone := apierrors.NewResourceExpired("too old resource version")
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", errors.New("rbac"))
	for _, want := range []error{gone, forbidden} {
		lw := &scriptedLW{errs: []error{want}}
		p := newPromptListWatch("services", lw)
		p.sleep = func(context.Context, time.Duration) bool {
			t.Error("slept on an error the reflector must see")
			return true
		}
		if _, err := p.ListWithContext(context.Background(), metav1.ListOptions{}); !errors.Is(err, want) {
			t.Errorf("got %v, want %v passed through", err, want)
		}
	}
}

func TestPromptListWatchStopsWithItsContext(t *testing.T) {
	lw := &scriptedLW{errs: []error{refused(), refused(), refused()}}
	p := newPromptListWatch("services", lw)
	ctx, cancel := context.WithCancel(context.Background())
	p.sleep = func(context.Context, time.Duration) bool { cancel(); return false }
	if _, err := p.ListWithContext(ctx, metav1.ListOptions{}); err == nil || lw.calls != 1 {
		t.Errorf("after cancel: err %v, calls %d", err, lw.calls)
	}
}
