package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestSyncedWaitsForTheHandler: the proxy's informers count as synced
// only once their handler has been given the whole initial list, not when
// the list has arrived; otherwise the first full pass would prune every
// service the handler has not been told of yet.
func TestSyncedWaitsForTheHandler(t *testing.T) {
	client := fake.NewClientset()
	for i := 0; i < 3; i++ {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d", i)}}
		if _, err := client.CoreV1().Services("ns").Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	handled := make(chan string, 3)
	release := make(chan struct{})
	inf := newInformer("services", &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.CoreV1().Services("").List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().Services("").Watch(ctx, o)
		},
	}, nil, &v1.Service{}, cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		name := obj.(*v1.Service).Name
		handled <- name
		if name == "s2" { // the list's last: held until released
			<-release
		}
	}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.RunWithContext(ctx)
	synced := allSynced([]cache.Controller{inf})

	for i := 0; i < 3; i++ {
		select {
		case <-handled:
		case <-time.After(10 * time.Second):
			t.Fatalf("the handler was given %d of 3 services", i)
		}
	}
	if synced() {
		t.Fatal("synced while the handler is still being given the list's last Service")
	}
	close(release)
	waitUntil(t, "the handler synced", synced)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
