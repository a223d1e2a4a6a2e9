package sync

import (
	"fmt"
	"strconv"
	"strings"
)

// AnnotationWeights gives a Service's real servers IPVS weights by where
// their endpoint runs, read from the EndpointSlice (each endpoint's zone
// and nodeName), so the proxy needs no watch of Pods or Nodes:
//
//	ipvsproxy.io/weights: "zone=us-east-1a:3,zone=us-east-1b:1,node=big-1:4"
//
// Each comma-separated term is zone=ZONE:WEIGHT or node=NODE:WEIGHT, the
// weight a whole number from 1 to 65535 (ipvsadm's range; 0 would stop
// new connections, which is graceful termination's job, not a policy's).
// An endpoint gets the weight of the term naming its node, else of the
// term naming its zone, else 1. A bad annotation (an unknown key, a
// missing name, a weight out of range, a zone or node named twice) is
// refused whole with a Warning Event, and every real server gets 1: half
// a weight map could send more traffic where the user wanted less.
const AnnotationWeights = "ipvsproxy.io/weights"

// weightScope is what a term of AnnotationWeights selects endpoints by.
type weightScope string

const (
	weightByZone weightScope = "zone" // the endpoint's zone (topology.kubernetes.io/zone of its node)
	weightByNode weightScope = "node" // the endpoint's nodeName
)

// maxWeight is the largest weight ipvsadm accepts.
const maxWeight = 65535

// endpointWeights is a parsed AnnotationWeights; the zero value gives
// every endpoint weight 1.
type endpointWeights struct {
	byZone, byNode map[string]int32
}

// weightOf is the weight of an endpoint in zone on node ("" when the slice
// does not say).
func (w endpointWeights) weightOf(zone, node string) int32 {
	if n, ok := w.byNode[node]; ok && node != "" {
		return n
	}
	if z, ok := w.byZone[zone]; ok && zone != "" {
		return z
	}
	return 1
}

// weightsFor reads the service's AnnotationWeights. On a bad value it
// returns the zero endpointWeights and the problem, for a Warning Event.
func weightsFor(annotations map[string]string) (endpointWeights, string) {
	v, ok := annotations[AnnotationWeights]
	if !ok || strings.TrimSpace(v) == "" {
		return endpointWeights{}, ""
	}
	w, err := parseWeights(v)
	if err != nil {
		return endpointWeights{}, fmt.Sprintf("annotation %s: %v; every endpoint gets weight 1", AnnotationWeights, err)
	}
	return w, ""
}

func parseWeights(v string) (endpointWeights, error) {
	w := endpointWeights{byZone: map[string]int32{}, byNode: map[string]int32{}}
	for _, term := range strings.Split(v, ",") {
		term = strings.TrimSpace(term)
		scope, rest, ok := strings.Cut(term, "=")
		i := strings.LastIndexByte(rest, ':')
		if !ok || i < 0 {
			return endpointWeights{}, fmt.Errorf("%q is not zone=ZONE:WEIGHT or node=NODE:WEIGHT", truncate(term))
		}
		name, weight := strings.TrimSpace(rest[:i]), strings.TrimSpace(rest[i+1:])
		var m map[string]int32
		switch weightScope(strings.TrimSpace(scope)) {
		case weightByZone:
			m = w.byZone
		case weightByNode:
			m = w.byNode
		default:
			return endpointWeights{}, fmt.Errorf("%q: weights are by zone or node, not %q", truncate(term), truncate(scope))
		}
		n, err := strconv.ParseUint(weight, 10, 16)
		switch {
		case name == "":
			return endpointWeights{}, fmt.Errorf("%q names no %s", truncate(term), scope)
		case err != nil || n < 1 || n > maxWeight:
			return endpointWeights{}, fmt.Errorf("%q: weight %q is not a whole number from 1 to %d", truncate(term), truncate(weight), maxWeight)
		}
		if _, dup := m[name]; dup {
			return endpointWeights{}, fmt.Errorf("%s %q is given a weight twice", scope, truncate(name))
		}
		m[name] = int32(n)
	}
	return w, nil
}

// weightBlind are the schedulers that give every real server of weight 1
// or more the same share: a service with weights and one of them is told
// so, since its weights change nothing.
var weightBlind = map[string]bool{"rr": true, "lc": true, "dh": true}

// weightsFor reads the service's weights, reporting a bad annotation and
// weights its scheduler ignores.
func (b *serviceBuilder) weightsFor() endpointWeights {
	w, problem := weightsFor(b.svc.Annotations)
	if problem != "" {
		b.problem("%s", problem)
	}
	if len(w.byZone)+len(w.byNode) > 0 && weightBlind[b.sched] {
		b.problem("annotation %s: scheduler %q ignores weights; ask for a weighted one (wrr, wlc, sed, nq, twos, sh, mh) with %s", AnnotationWeights, b.sched, AnnotationScheduler)
	}
	return w
}
