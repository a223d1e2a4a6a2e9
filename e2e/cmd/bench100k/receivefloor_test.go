//go:build e2e

package main

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

func TestReceiveFloorGetsEveryListedObject(t *testing.T) {
	w, srv, client := served(t, 1500)
	f := measureReceive(client)
	want := w.n + len(criticalServices) // the service the selector excludes is not sent
	if f.Error != "" || f.Services != want || f.Slices != want || f.Seconds <= 0 {
		t.Fatalf("received %+v, want %d services and %d slices", f, want, want)
	}
	if srv.watchLists.Load() != 2 {
		t.Errorf("served %s; want two watch-lists", srv.summary())
	}
}

func TestReceiveFloorReportsAWatchThatEndsEarly(t *testing.T) {
	_, srv, client := served(t, 10)
	srv.cs.PrependReactor("list", "endpointslices", failList)
	f := measureReceive(client)
	if f.Error == "" || !strings.Contains(f.Error, "endpointslices") {
		t.Fatalf("received %+v, want the endpoint slices' failure", f)
	}
}

// failList makes the fake's lists fail, as a server that breaks off a
// watch-list would.
func failList(clienttesting.Action) (bool, runtime.Object, error) {
	return true, nil, errors.New("the fake refuses to list")
}
